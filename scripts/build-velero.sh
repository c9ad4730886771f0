#!/usr/bin/env bash
# Builds the real Velero server and CLI (`velero`) and Velero's AWS object-store plugin
# (`velero-plugin-for-aws`) from the Go module proxy at pinned versions, writes Velero's own
# CRDs of that version (`velero install --crds-only --dry-run -o yaml`), builds
# `interop/goplugin-host` (the program that loads plugins with Velero's own plugin manager)
# against that same Velero, and caches all four outside target/, keyed by the versions and the
# plugin host's source. Prints the directory holding them.
#
#   scripts/build-velero.sh            # build (or reuse) and print the directory
#
# Environment: FERRY_VELERO_VERSION (default v1.18.3), FERRY_VELERO_AWS_VERSION (default
# v1.14.3), XDG_CACHE_HOME. A cold build takes about 10-15 minutes on two cores (it shares Go's
# module and build caches with scripts/build-control-plane.sh); a warm run takes milliseconds.
# Another Velero version must be one `interop/goplugin-host/main.go` compiles against.
set -euo pipefail

velero_version="${FERRY_VELERO_VERSION:-v1.18.3}"
aws_version="${FERRY_VELERO_AWS_VERSION:-v1.14.3}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/ferry"
root="$(cd "$(dirname "$0")/.." && pwd)"
host_src="$root/interop/goplugin-host/main.go"
# Keyed by the plugin host's source and by this script (its pins and build flags).
host_key="$(cat "$host_src" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-12)"
out="$cache/velero-${velero_version}-aws-${aws_version}-host-${host_key}"

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

log() { printf 'build-velero: %s\n' "$*" >&2; }

if [[ -x "$out/velero" && -x "$out/velero-plugin-for-aws" && -x "$out/goplugin-host" && -s "$out/velero-crds.yaml" ]]; then
  echo "$out"
  exit 0
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/ferry-velero-build.XXXXXX")"
trap 'rm -rf "$work" "$out.partial-$$"' EXIT
start=$(date +%s)

# One wrapper module for the three programs, so they share one dependency graph and one build:
# the plugin host (a package of the wrapper module) compiles nothing Velero's build has not
# compiled already, and it loads plugins with exactly the Velero code the tests run.
# Velero's go.mod replaces kopia with the Velero project's fork; a dependency's replace
# directives do not apply to the main module, so every one of them is repeated here. The
# proxy refuses k8s.io/cli-runtime v0.33.12 (Velero's pin), so the next patch release is used.
mod_json="$(go mod download -json "github.com/vmware-tanzu/velero@${velero_version}")"
gomod="$(printf '%s' "$mod_json" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')"
cd "$work"
go mod init ferry.local/velero-build >/dev/null 2>&1
cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "github.com/vmware-tanzu/velero-plugin-for-aws/velero-plugin-for-aws"
	_ "github.com/vmware-tanzu/velero/cmd/velero"
)
GO
mkdir goplugin-host
cp "$host_src" goplugin-host/main.go
edits=(
  "-require=github.com/vmware-tanzu/velero@${velero_version}"
  "-require=github.com/vmware-tanzu/velero-plugin-for-aws@${aws_version}"
  "-require=k8s.io/cli-runtime@v0.33.13"
)
while read -r from to; do
  [[ -n "$from" ]] && edits+=("-replace=${from}=${to}")
done < <(sed -n 's#^replace[[:space:]]\+\([^ ]*\)[[:space:]]*=>[[:space:]]*\([^ ]*\)[[:space:]]\+\([^ ]*\).*#\1 \2@\3#p' "$gomod")
go mod edit "${edits[@]}"
log "resolving Velero ${velero_version} and velero-plugin-for-aws ${aws_version}"
go mod tidy >&2

mkdir -p "$out.partial-$$"
log "building velero, velero-plugin-for-aws and goplugin-host (cold: about 10-15 minutes)"
pkg=github.com/vmware-tanzu/velero/pkg/buildinfo
# No DWARF from the compiler: the linker strips it anyway (-w), and skipping it saves ~11 % of
# the compile (as in scripts/build-control-plane.sh).
go build -trimpath -gcflags=all=-dwarf=false \
  -ldflags "-s -w -X ${pkg}.Version=${velero_version} -X ${pkg}.GitTreeState=clean" \
  -o "$out.partial-$$/" \
  github.com/vmware-tanzu/velero/cmd/velero \
  github.com/vmware-tanzu/velero-plugin-for-aws/velero-plugin-for-aws \
  ./goplugin-host >&2

# Velero's CRDs exactly as `velero install` of this version applies them.
"$out.partial-$$/velero" install --crds-only --dry-run -o yaml > "$out.partial-$$/velero-crds.yaml"
grep -q 'name: datauploads.velero.io' "$out.partial-$$/velero-crds.yaml" \
  || { log "velero install --crds-only printed no DataUpload CRD"; exit 1; }

rm -rf "$out"
mv "$out.partial-$$" "$out"
log "velero ${velero_version}, velero-plugin-for-aws ${aws_version} and goplugin-host in $out ($(( $(date +%s) - start )) s)"
echo "$out"
