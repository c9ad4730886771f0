#!/usr/bin/env bash
# The node agent's targets on a real run: three `ferry agent` processes on simulated nodes
# (real control plane, loop devices, moto S3), release build.
#   - agent memory when idle (target < 50 MiB resident),
#   - DataUpload created -> Completed against a bare `ferry backup` of the same data into the
#     same S3 server (target <= 1.5x),
#   - progress on the CR after the upload starts (target <= 5 s).
# The S3 server is MinIO, built once from the Go module proxy (pinned in minio.sh): moto, the
# tests' server, would set the pace of both the DataUpload and the bare backup.
# FERRY_BENCH_S3=moto uses moto.
# The simulated nodes keep their volumes on an XFS file system with reflinks (an image file in
# the temp folder, loop-mounted; mkfs.xfs from Debian's xfsprogs, downloaded once), so the
# simulated CSI driver clones a snapshot into a volume copy-on-write as real CSI drivers do,
# instead of copying the whole image. FERRY_BENCH_STORAGE=disk keeps them in the temp folder.
# Usage: benches/compare/agent.sh [SIZE_MIB] [FILES]     (default 1024 MiB in 3000 files)
set -euo pipefail
cd "$(dirname "$0")/../.."
size="${1:-1024}"
files="${2:-3000}"
. benches/compare/minio.sh
scripts/setup.sh
s3_args=()
if [[ "${FERRY_BENCH_S3:-minio}" == minio ]]; then
  s3_args=(--minio "$(minio_binary)")
fi
sim_args=()
if [[ "${FERRY_BENCH_STORAGE:-xfs}" == xfs ]]; then
  # Debian bookworm's xfsprogs and the two libraries it needs beyond a base system.
  XFS_DEBS=(xfsprogs=6.1.0-1 libinih1=55-1 liburcu8=0.13.2-1)
  xfs="${XDG_CACHE_HOME:-$HOME/.cache}/ferry/tools/xfsprogs-6.1.0"
  if [[ ! -x "$xfs/sbin/mkfs.xfs" ]]; then
    echo "fetching ${XFS_DEBS[*]} (once; cached in $xfs)"
    dl="$(mktemp -d)"
    (cd "$dl" && timeout 300 apt-get download "${XFS_DEBS[@]}")
    mkdir -p "$xfs.partial"
    for deb in "$dl"/*.deb; do dpkg-deb -x "$deb" "$xfs.partial"; done
    rm -rf "$dl" "$xfs"
    mkdir -p "$xfs/sbin"
    mv "$xfs.partial/usr/lib/x86_64-linux-gnu" "$xfs/lib"
    mv "$xfs.partial/sbin/mkfs.xfs" "$xfs/sbin/mkfs.xfs"
    rm -rf "$xfs.partial"
  fi
  store="$(mktemp -d "${TMPDIR:-/tmp}/ferry-bench-xfs.XXXXXX")"
  cleanup_store() {
    # The simulator's janitor may still be detaching loop devices backed by files in the
    # mount for a second or two after the demo exits: wait for them, then unmount.
    for _ in $(seq 1 30); do
      losetup -n -l -O BACK-FILE 2>/dev/null | grep -qF "$store/mnt/" || break
      sleep 1
    done
    for _ in $(seq 1 10); do
      mountpoint -q "$store/mnt" || break
      umount "$store/mnt" 2>/dev/null || sleep 1
    done
    [[ -n "$store_dev" ]] && losetup --detach "$store_dev"
    rm -rf "$store"
  }
  store_dev=""
  trap cleanup_store EXIT
  truncate -s 16G "$store/xfs.img"
  # Direct I/O: the file system's blocks are not cached a second time as pages of its image
  # file, so what the bench drops from the page cache is read from the disk again.
  store_dev="$(losetup --find --show --direct-io=on "$store/xfs.img")"
  LD_LIBRARY_PATH="$xfs/lib" "$xfs/sbin/mkfs.xfs" -q -m reflink=1 "$store_dev"
  mkdir "$store/mnt"
  mount "$store_dev" "$store/mnt"
  sim_args=(--sim-dir "$store/mnt")
fi
cargo build --locked --release -p ferry -p ferry-demo
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "simulated storage: ${FERRY_BENCH_STORAGE:-xfs}"
target/release/ferry-demo --ferry target/release/ferry --bench --size "$size" --files "$files" \
  "${s3_args[@]}" "${sim_args[@]}"
