#!/usr/bin/env bash
# Installs what Ferry's build, tests and demo need on a fresh machine, from the package
# registries only. Idempotent: a prepared machine passes through in a second.
# `--packages-only` stops before the Go-built tools (`make tools` builds them; `make -j4 test`
# builds them beside the Rust tests).
set -euo pipefail
log() { printf 'setup: %s\n' "$*" >&2; }

need_apt=()
command -v openssl >/dev/null || need_apt+=(openssl)
command -v mkfs.ext4 >/dev/null || need_apt+=(e2fsprogs)
command -v losetup >/dev/null || need_apt+=(mount)
command -v setfattr >/dev/null || need_apt+=(attr)
# The real node: runc links libseccomp; test pods run a static busybox; unshare and nsenter.
[[ -f /usr/include/seccomp.h ]] || need_apt+=(libseccomp-dev)
# ldd exits 1 on a static binary: its output is tested, not a pipeline's status (pipefail).
[[ -x /bin/busybox && "$(ldd /bin/busybox 2>&1 || true)" == *"not a dynamic"* ]] \
  || need_apt+=(busybox-static)
command -v unshare >/dev/null || need_apt+=(util-linux)
command -v ip >/dev/null || need_apt+=(iproute2)
if ((${#need_apt[@]})); then
  log "installing ${need_apt[*]} from Debian"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if ! command -v moto_server >/dev/null; then
  log "installing moto (S3 server for tests) from PyPI"
  python3 -m pip install --quiet 'moto[server]==5.2.1'
fi

command -v cargo >/dev/null || { log "cargo is missing: install Rust (rustup) first"; exit 1; }
command -v go >/dev/null || { log "go is missing: install Go first"; exit 1; }
installed=$(rustup component list --installed 2>/dev/null || true)
[[ $installed == *clippy* && $installed == *rustfmt* ]] || rustup component add clippy rustfmt

if [[ ${1:-} == --packages-only ]]; then
  log "ready (packages only)"
  exit 0
fi
log "building the test control plane (cached after the first run)"
scripts/build-control-plane.sh >/dev/null
log "building Velero, its AWS plugin and the Go plugin host for the real-Velero tests (cached after the first run)"
scripts/build-velero.sh >/dev/null
log "building the real node's components for the real-cluster tests (cached after the first run)"
scripts/build-realnode.sh >/dev/null
log "ready"
