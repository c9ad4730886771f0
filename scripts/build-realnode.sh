#!/usr/bin/env bash
# Builds the parts of a real Kubernetes node for Ferry's real-cluster tests and caches them
# outside target/, keyed by version: kubelet, kube-controller-manager and kube-scheduler (the
# control plane's Kubernetes version, built from the same wrapper module as kube-apiserver so
# Go's build cache shares every common package), containerd v2 and runc, the CNI bridge,
# host-local and loopback plugins, the CSI external-provisioner, csi-snapshotter and
# snapshot-controller (Go module proxy), the CSI hostpath driver, node-driver-registrar and the
# csi-snapshot-metadata sidecar with its CRD (built offline from their release sources in
# ../shared/third-party/, which the proxy refuses),
# and two one-layer OCI images (a pause image and a busybox image for test pods).
# Prints the directory holding the binaries (images in its sibling `images/`).
#
#   scripts/build-realnode.sh            # build (or reuse) and print the bin directory
#
# Environment: FERRY_K8S_VERSION (default v1.36.2), FERRY_THIRD_PARTY (default
# ../shared/third-party beside the workspace), XDG_CACHE_HOME. Cold: about 15-20 minutes on two
# cores after scripts/build-control-plane.sh (measured: 10 minutes beside the control plane's
# and Velero's builds, 13 minutes for all three); warm: milliseconds.
set -euo pipefail

k8s_version="${FERRY_K8S_VERSION:-v1.36.2}"
containerd_version=v2.4.2
runc_version=v1.5.2
cni_version=v1.10.0
# The CSI sidecars are pinned to the releases whose code builds against the kubelet's k8s.io
# libraries (v0.36.x): one wrapper module for both, sharing the compiled client-go with the
# Kubernetes commands (the newest releases need k8s.io v0.37 libraries nothing else shares).
provisioner_version=v6.3.0
snapshotter_version=v8.6.0
hostpath_version=v1.18.0
registrar_version=v2.17.0
snapshot_metadata_version=v1.1.0

root="$(cd "$(dirname "$0")/.." && pwd)"
third_party="${FERRY_THIRD_PARTY:-$root/../shared/third-party}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/ferry/realnode"
bin="$cache/bin"
images="$cache/images"
manifests="$cache/manifests"
mkdir -p "$bin" "$images" "$manifests"
# The SnapshotMetadataService CRD, taken from the sidecar's release.
crd_file=cbt.storage.k8s.io_snapshotmetadataservices.yaml

# have NAME VERSION: NAME was built at VERSION already.
have() { [[ -x "$bin/$1" && "$(cat "$bin/.$1.version" 2>/dev/null)" == "$2" ]]; }

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
# No DWARF from the compiler: the linker strips it anyway (-w), and skipping it saves ~11 % of
# the compile (measured on etcd v3.6.8, cold: 144 s of CPU time with DWARF, 128 without).
nodwarf=-gcflags=all=-dwarf=false

log() { printf 'build-realnode: %s\n' "$*" >&2; }
done_with() { # done_with NAME VERSION START
  echo "$2" > "$bin/.$1.version"
  log "$1 $2 built in $((SECONDS - $3)) s"
}

# Every binary at the version this script builds (a changed pin rebuilds it).
need=(containerd:$containerd_version ctr:$containerd_version containerd-shim-runc-v2:$containerd_version
  runc:$runc_version bridge:$cni_version host-local:$cni_version loopback:$cni_version
  kubelet:$k8s_version kube-controller-manager:$k8s_version kube-scheduler:$k8s_version
  csi-provisioner:$provisioner_version csi-snapshotter:$snapshotter_version
  snapshot-controller:$snapshotter_version hostpathplugin:$hostpath_version
  csi-node-driver-registrar:$registrar_version csi-snapshot-metadata:$snapshot_metadata_version)
ready=1
for b in "${need[@]}"; do have "${b%%:*}" "${b#*:}" || ready=""; done
[[ -f "$images/pause.tar" && -f "$images/busybox.tar" && "$(cat "$images/.version" 2>/dev/null)" == 2 ]] || ready=""
[[ -f "$manifests/$crd_file" && ! -L "$manifests/$crd_file" && "$(cat "$manifests/.version" 2>/dev/null)" == "$snapshot_metadata_version" ]] || ready=""
if [[ -n "$ready" ]]; then
  echo "$bin"
  exit 0
fi

# One build at a time: parallel test binaries wait for it and reuse what it built.
exec 9>"$cache/.lock"
flock 9

work="$(mktemp -d "${TMPDIR:-/tmp}/ferry-node-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# Packages scripts/setup.sh installs: runc links libseccomp; test pods run a static busybox.
[[ -f /usr/include/seccomp.h ]] || { log "libseccomp-dev is missing: run scripts/setup.sh"; exit 1; }
# ldd exits 1 on a static binary (and grep -q may close the pipe early): under pipefail a
# pipeline would call every busybox missing, so the output is taken first.
[[ -x /bin/busybox && "$(ldd /bin/busybox 2>&1 || true)" == *"not a dynamic"* ]] \
  || { log "a static /bin/busybox (busybox-static) is missing: run scripts/setup.sh"; exit 1; }

# wrapper DIR MODULE@VERSION...: a module in DIR requiring each MODULE@VERSION and repeating the
# version replaces of their go.mod files (Go ignores a dependency's replaces).
wrapper() {
  local dir="$1"; shift
  mkdir -p "$dir"
  (cd "$dir" && { [[ -f go.mod ]] || go mod init ferry.local/realnode-build >/dev/null 2>&1; })
  local spec gomod
  for spec in "$@"; do
    gomod="$(go mod download -json "$spec" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
    (
      cd "$dir"
      go mod edit -require="$spec"
      mapfile -t reps < <(go mod edit -json "$gomod" | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    new = r["New"]
    if new.get("Version"):
        old = r["Old"]["Path"] + ("@" + r["Old"]["Version"] if r["Old"].get("Version") else "")
        print("-replace=%s=%s@%s" % (old, new["Path"], new["Version"]))')
      if ((${#reps[@]})); then go mod edit "${reps[@]}"; fi
    )
  done
}

# tools DIR PKG...: a tools.go importing the commands to build, then go mod tidy.
tools() {
  local dir="$1"; shift
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    printf '\t_ "%s"\n' "$@"
    printf ')\n'
  } > "$dir/tools.go"
  (cd "$dir" && go mod tidy >&2)
}

# gobuild DIR NAME PKG [go build args...]
gobuild() {
  local dir="$1" name="$2" pkg="$3"; shift 3
  (cd "$dir" && go build -trimpath "$nodwarf" "$@" -o "$bin/$name.partial" "$pkg") >&2
  mv "$bin/$name.partial" "$bin/$name"
}

build_images() {
  local v=2 d="$work/img"
  [[ -f "$images/pause.tar" && -f "$images/busybox.tar" && "$(cat "$images/.version" 2>/dev/null)" == "$v" ]] && return 0
  log "building the pause and busybox images"
  mkdir -p "$d/pause-src" "$d/pause/rootfs" "$d/busybox/rootfs/bin"
  # pause: sleeps until SIGTERM or SIGINT and reaps the children it inherits.
  cat > "$d/pause-src/main.go" <<'GO'
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			if pid, _ := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 {
				break
			}
		}
	}
}
GO
  (cd "$d/pause-src" && go mod init ferry.local/pause >/dev/null 2>&1 && go build -trimpath "$nodwarf" -ldflags "-s -w" -o "$d/pause/rootfs/pause" .)
  cp /bin/busybox "$d/busybox/rootfs/bin/busybox"
  local a
  for a in sh ls cat echo sleep md5sum sha256sum stat find mkdir rm cp mv ln dd head tail wc sync touch grep sed awk \
    id test true false env blockdev cmp seq sort xargs readlink chmod tr cut printf truncate; do
    ln -sf busybox "$d/busybox/rootfs/bin/$a"
  done
  mkdir -p "$d/busybox/rootfs/tmp"
  python3 "$root/scripts/oci-image.py" "$d/pause/rootfs" "$images/pause.tar" ferry.local/pause:1 '["/pause"]'
  python3 "$root/scripts/oci-image.py" "$d/busybox/rootfs" "$images/busybox.tar" ferry.local/busybox:1 '["/bin/sh"]'
  echo $v > "$images/.version"
}

build_runc() {
  have runc $runc_version && return 0
  local d="$work/runc" m=github.com/opencontainers/runc t0=$SECONDS
  log "building runc $runc_version (cgo, libseccomp)"
  wrapper "$d" "$m@$runc_version"
  tools "$d" "$m"
  CGO_ENABLED=1 gobuild "$d" runc "$m" -tags "seccomp urfave_cli_no_docs" -ldflags "-s -w -X main.version=${runc_version#v}"
  done_with runc $runc_version $t0
}

build_cni() {
  have bridge $cni_version && have host-local $cni_version && have loopback $cni_version && return 0
  local d="$work/cni" m=github.com/containernetworking/plugins t0=$SECONDS p
  log "building the CNI plugins $cni_version"
  wrapper "$d" "$m@$cni_version"
  tools "$d" "$m/plugins/main/loopback" "$m/plugins/main/bridge" "$m/plugins/ipam/host-local"
  for p in main/loopback main/bridge ipam/host-local; do
    gobuild "$d" "${p#*/}" "$m/plugins/$p" -ldflags "-s -w"
    done_with "${p#*/}" $cni_version $t0
  done
}

build_containerd() {
  have containerd $containerd_version && have ctr $containerd_version && have containerd-shim-runc-v2 $containerd_version && return 0
  local d="$work/containerd" m=github.com/containerd/containerd/v2 t0=$SECONDS c
  log "building containerd $containerd_version"
  wrapper "$d" "$m@$containerd_version"
  tools "$d" "$m/cmd/containerd" "$m/cmd/ctr" "$m/cmd/containerd-shim-runc-v2"
  for c in containerd ctr containerd-shim-runc-v2; do
    gobuild "$d" $c "$m/cmd/$c" -tags no_btrfs \
      -ldflags "-s -w -X $m/version.Version=$containerd_version -X $m/version.Package=$m"
    done_with $c $containerd_version $t0
  done
}

# vendored NAME VERSION ARCHIVE PKG: built -mod=vendor from a release archive (no proxy).
vendored() {
  local name="$1" version="$2" archive="$3" pkg="$4" d="$work/$1" t0=$SECONDS
  have "$name" "$version" && return 0
  [[ -f "$archive" ]] || { log "missing $archive (the Go module proxy refuses $name; its release source belongs there)"; exit 1; }
  log "building $name $version from $archive"
  mkdir -p "$d"
  tar -xzf "$archive" -C "$d" --strip-components=1
  GOFLAGS=-mod=vendor gobuild "$d" "$name" "$pkg" -ldflags "-s -w -X main.version=$version"
  done_with "$name" "$version" $t0
}

# The Kubernetes commands: the wrapper module of scripts/build-control-plane.sh (k8s.io/kubernetes
# with every staging module replaced by its tag), so the packages kube-apiserver compiled are
# reused from Go's build cache.
build_k8s() {
  local cmds=() c
  for c in kubelet kube-controller-manager kube-scheduler; do have $c "$k8s_version" || cmds+=("$c"); done
  ((${#cmds[@]})) || return 0
  local d="$work/k8s" gomod staging="v0.${k8s_version#v1.}" minor="${k8s_version#v1.}" pkg=k8s.io/component-base/version
  minor="${minor%%.*}"
  gomod="$(go mod download -json "k8s.io/kubernetes@$k8s_version" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
  mkdir -p "$d"
  (
    cd "$d"
    go mod init ferry.local/k8s-build >/dev/null 2>&1
    reps=()
    while read -r module; do reps+=("-replace=$module=$module@$staging"); done \
      < <(sed -n 's#^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/.*#\1#p' "$gomod")
    go mod edit "${reps[@]}" -require="k8s.io/kubernetes@$k8s_version"
  )
  tools "$d" k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler
  for c in "${cmds[@]}"; do
    local t0=$SECONDS
    log "building $c $k8s_version"
    gobuild "$d" "$c" "k8s.io/kubernetes/cmd/$c" \
      -ldflags "-s -w -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    done_with "$c" "$k8s_version" $t0
  done
}

build_sidecars() {
  have csi-provisioner $provisioner_version && have csi-snapshotter $snapshotter_version \
    && have snapshot-controller $snapshotter_version && return 0
  local d="$work/sidecars" p=github.com/kubernetes-csi/external-provisioner/v6 \
    s=github.com/kubernetes-csi/external-snapshotter/v8 staging="v0.${k8s_version#v1.}" t0=$SECONDS m
  log "building csi-provisioner $provisioner_version, csi-snapshotter and snapshot-controller $snapshotter_version"
  wrapper "$d" "$p@$provisioner_version" "$s@$snapshotter_version"
  tools "$d" "$p/cmd/csi-provisioner" "$s/cmd/csi-snapshotter" "$s/cmd/snapshot-controller"
  # Pin every k8s.io library both require to the kubelet's version.
  local pins=()
  while read -r m; do pins+=("-require=$m@$staging"); done < <(cd "$d" && go list -m all 2>/dev/null \
    | awk '$1 ~ /^k8s\.io\/(api|apimachinery|apiserver|client-go|component-base|component-helpers|csi-translation-lib|kube-scheduler|cloud-provider|controller-manager|kubelet|kms|apiextensions-apiserver|dynamic-resource-allocation)$/ {print $1}')
  if ((${#pins[@]})); then (cd "$d" && go mod edit "${pins[@]}" && go mod tidy >&2); fi
  gobuild "$d" csi-provisioner "$p/cmd/csi-provisioner" -ldflags "-s -w -X main.version=$provisioner_version"
  done_with csi-provisioner $provisioner_version $t0
  gobuild "$d" csi-snapshotter "$s/cmd/csi-snapshotter" -ldflags "-s -w -X main.version=$snapshotter_version"
  done_with csi-snapshotter $snapshotter_version $t0
  gobuild "$d" snapshot-controller "$s/cmd/snapshot-controller" -ldflags "-s -w -X main.version=$snapshotter_version"
  done_with snapshot-controller $snapshotter_version $t0
}

start=$SECONDS
build_images
build_runc
build_cni
build_containerd
vendored hostpathplugin $hostpath_version "$third_party/csi-driver-host-path-$hostpath_version.tar.gz" ./cmd/hostpathplugin
vendored csi-node-driver-registrar $registrar_version "$third_party/node-driver-registrar-$registrar_version.tar.gz" ./cmd/csi-node-driver-registrar
snapshot_metadata_archive="$third_party/external-snapshot-metadata-$snapshot_metadata_version.tar.gz"
vendored csi-snapshot-metadata $snapshot_metadata_version "$snapshot_metadata_archive" ./cmd/csi-snapshot-metadata
if [[ ! -f "$manifests/$crd_file" || -L "$manifests/$crd_file" || "$(cat "$manifests/.version" 2>/dev/null)" != "$snapshot_metadata_version" ]]; then
  # (deploy/ holds a symbolic link to this file.)
  rm -f "$manifests/$crd_file"
  tar -xzOf "$snapshot_metadata_archive" \
    "external-snapshot-metadata-$snapshot_metadata_version/client/config/crd/$crd_file" \
    > "$manifests/$crd_file.tmp"
  mv "$manifests/$crd_file.tmp" "$manifests/$crd_file"
  echo "$snapshot_metadata_version" > "$manifests/.version"
fi
build_k8s
build_sidecars
log "node components ready in $bin ($((SECONDS - start)) s)"
echo "$bin"
