#!/usr/bin/env bash
# Builds helm from the Go module proxy at a pinned version and caches the binary outside
# target/, keyed by version. Prints the path of the binary. Used by the deploy tests to render
# deploy/helm/ferry; a helm already on the machine is not used, so every run renders with the
# same version.
#
#   deploy/build-helm.sh            # build (or reuse) and print the helm binary's path
#
# Environment: FERRY_HELM_VERSION (default v3.22.0), XDG_CACHE_HOME. A cold build takes a few
# minutes on two cores; a warm run takes milliseconds.
set -euo pipefail

helm_version="${FERRY_HELM_VERSION:-v3.22.0}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/ferry"
bin_dir="$cache/helm-${helm_version}"

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

if [[ -x "$bin_dir/helm" ]]; then
  echo "$bin_dir/helm"
  exit 0
fi

mkdir -p "$bin_dir"
# Tests render the chart in parallel: one build at a time, the others wait for it and reuse it.
exec 9>"$bin_dir/.lock"
flock 9
if [[ -x "$bin_dir/helm" ]]; then
  echo "$bin_dir/helm"
  exit 0
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/ferry-helm-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
printf 'build-helm: building helm %s\n' "$helm_version" >&2
(
  cd "$work"
  go mod init ferry.local/helm-build >/dev/null 2>&1
  cat > tools.go <<'GO'
//go:build tools

package tools

import _ "helm.sh/helm/v3/cmd/helm"
GO
  go get "helm.sh/helm/v3@${helm_version}" >&2
  ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=${helm_version}"
  go build -trimpath -ldflags "$ldflags" -o "$bin_dir/helm.partial" helm.sh/helm/v3/cmd/helm >&2
)
mv "$bin_dir/helm.partial" "$bin_dir/helm"
echo "$bin_dir/helm"
