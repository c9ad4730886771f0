# Sourced by agent.sh and run.sh: MinIO, the benchmarks' S3 server, built once from the Go
# module proxy. moto, the tests' server, runs in one Python thread that saturates at about
# 60 MB/s of uploads, so it would set the pace of any data mover measured against it.

# MinIO's last commit on its main branch (2026-02-12; it publishes no module versions).
MINIO_VERSION="v0.0.0-20260212201848-7aac2a2c5b7c"

# Prints the path of the minio binary, building it into the cache first if it is not there.
minio_binary() {
  local dir="${XDG_CACHE_HOME:-$HOME/.cache}/ferry/tools/minio-$MINIO_VERSION"
  if [[ ! -x "$dir/minio" ]]; then
    command -v go >/dev/null || { echo "go is required to build MinIO" >&2; return 1; }
    echo "building MinIO $MINIO_VERSION from the Go module proxy (once; cached in $dir)" >&2
    mkdir -p "$dir"
    GOBIN="$dir/.partial" GOTOOLCHAIN=local CGO_ENABLED=0 timeout 1800 \
      go install "github.com/minio/minio@$MINIO_VERSION" >&2 || { rm -rf "$dir/.partial"; return 1; }
    mv "$dir/.partial/minio" "$dir/minio"
    rmdir "$dir/.partial"
  fi
  echo "$dir/minio"
}
