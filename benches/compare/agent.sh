#!/usr/bin/env bash
# The node agent's targets on a real run: three `ferry agent` processes on simulated nodes
# (real control plane, loop devices, moto S3), release build.
#   - agent memory when idle (target < 50 MiB resident),
#   - DataUpload created -> Completed against a bare `ferry backup` of the same data into the
#     same S3 server (target <= 1.5x),
#   - progress on the CR after the upload starts (target <= 5 s).
# The S3 server is MinIO, built once from the Go module proxy (pinned below): moto, the tests'
# server, runs in one Python thread that saturates at about 60 MB/s of uploads, so it would
# set the pace of both the DataUpload and the bare backup. FERRY_BENCH_S3=moto uses moto.
# Usage: benches/compare/agent.sh [SIZE_MIB] [FILES]     (default 1024 MiB in 3000 files)
set -euo pipefail
cd "$(dirname "$0")/../.."
size="${1:-1024}"
files="${2:-3000}"
# MinIO's last commit on its main branch (2026-02-12; it publishes no module versions).
MINIO_VERSION="v0.0.0-20260212201848-7aac2a2c5b7c"
scripts/setup.sh
s3_args=()
if [[ "${FERRY_BENCH_S3:-minio}" == minio ]]; then
  dir="${XDG_CACHE_HOME:-$HOME/.cache}/ferry/tools/minio-$MINIO_VERSION"
  if [[ ! -x "$dir/minio" ]]; then
    command -v go >/dev/null || { echo "agent.sh: go is required to build MinIO" >&2; exit 1; }
    echo "building MinIO $MINIO_VERSION from the Go module proxy (once; cached in $dir)"
    mkdir -p "$dir"
    GOBIN="$dir/.partial" GOTOOLCHAIN=local CGO_ENABLED=0 timeout 1800 \
      go install "github.com/minio/minio@$MINIO_VERSION"
    mv "$dir/.partial/minio" "$dir/minio"
    rmdir "$dir/.partial"
  fi
  s3_args=(--minio "$dir/minio")
fi
cargo build --locked --release -p ferry -p ferry-demo
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, load $(cut -d' ' -f1-3 /proc/loadavg)"
exec target/release/ferry-demo --ferry target/release/ferry --bench --size "$size" --files "$files" "${s3_args[@]}"
