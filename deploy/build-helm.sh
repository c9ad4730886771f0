#!/usr/bin/env bash
# Builds helm from the Go module proxy at a pinned version and caches the binary outside
# target/, keyed by version and build recipe. Prints the path of the binary. Used by the deploy
# tests to render deploy/helm/ferry; a helm already on the machine is not used, so every run
# renders with the same version.
#
#   deploy/build-helm.sh            # build (or reuse) and print the helm binary's path
#
# Environment: FERRY_HELM_VERSION (default v3.22.0), XDG_CACHE_HOME. A cold build takes a few
# minutes on two cores; a warm run takes milliseconds.
set -euo pipefail

helm_version="${FERRY_HELM_VERSION:-v3.22.0}"
# The build recipe's revision, part of the cache key: raise it whenever the way helm is built
# changes, so a binary built the old way is not reused. Revision 2 stamps the Kubernetes version
# (revision 1 did not, and its helm took itself for Kubernetes v1.20).
recipe=2
cache="${XDG_CACHE_HOME:-$HOME/.cache}/ferry"
bin_dir="$cache/helm-${helm_version}-r${recipe}"

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
  # What helm's own release build stamps: its version (a tagged build: no metadata, a clean
  # tree; the module proxy has no commit to give), and the Kubernetes version it assumes when
  # it talks to no cluster (`helm template`: .Capabilities.KubeVersion, a chart's
  # `kubeVersion`), which helm derives from the k8s.io/client-go it is built with: client-go
  # v0.X.Y is Kubernetes v1.X. Without them helm assumes Kubernetes v1.20.
  client_go="$(go list -m -f '{{.Version}}' k8s.io/client-go)"
  if [[ ! "$client_go" =~ ^v0\.([0-9]+)\.[0-9]+ ]]; then
    printf 'build-helm: unexpected k8s.io/client-go version %q\n' "$client_go" >&2
    exit 1
  fi
  k8s_major=1 k8s_minor="${BASH_REMATCH[1]}"
  pkg=helm.sh/helm/v3
  ldflags=(
    -s -w
    -X "$pkg/internal/version.version=${helm_version}"
    -X "$pkg/internal/version.metadata="
    -X "$pkg/internal/version.gitTreeState=clean"
    -X "$pkg/pkg/lint/rules.k8sVersionMajor=${k8s_major}"
    -X "$pkg/pkg/lint/rules.k8sVersionMinor=${k8s_minor}"
    -X "$pkg/pkg/chartutil.k8sVersionMajor=${k8s_major}"
    -X "$pkg/pkg/chartutil.k8sVersionMinor=${k8s_minor}"
  )
  # -dwarf=false: the linker strips DWARF anyway (-w); not compiling it saves ~11 % of the time.
  go build -trimpath -gcflags=all=-dwarf=false -ldflags "${ldflags[*]}" -o "$bin_dir/helm.partial" "$pkg/cmd/helm" >&2
  mkdir -p chart/templates
  printf 'apiVersion: v2\nname: stamp-check\nversion: 0.1.0\n' > chart/Chart.yaml
  printf 'kube: {{ .Capabilities.KubeVersion.Version }}\n' > chart/templates/k.yaml
  # -X names a variable by path and is silently ignored when the variable is not there: check
  # that both stamps took before the binary is cached.
  got="$("$bin_dir/helm.partial" version --template '{{.Version}}')"
  if [[ "$got" != "$helm_version" ]]; then
    printf 'build-helm: helm reports version %q, not %q\n' "$got" "$helm_version" >&2
    exit 1
  fi
  kube="$("$bin_dir/helm.partial" template stamp-check chart)"
  if [[ "$kube" != *"kube: v${k8s_major}.${k8s_minor}."* ]]; then
    printf 'build-helm: helm assumes Kubernetes %q, not v%s.%s\n' "$kube" "$k8s_major" "$k8s_minor" >&2
    exit 1
  fi
)
mv "$bin_dir/helm.partial" "$bin_dir/helm"
echo "$bin_dir/helm"
