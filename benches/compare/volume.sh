#!/usr/bin/env bash
# Ferry volume snapshots on a real loop device: a 2 GiB ext4 volume half full of real files
# (the Linux 6.1 source tree used by run.sh), first backup, an incremental after 1 % of the
# files changed, and a restore onto a new image file. Reports wall time and GB/s of device size.
#
# The same steps with kopia (the version run.sh builds) reading the device as one stream, as
# Velero's kopia uploader does for block volumes: `kopia snapshot create --stdin-file`, and
# `kopia snapshot restore` of that file.
#
# "Half full": the first files of the tree in path order whose sizes add up to --fill percent
# (default 50) of the volume are hard-linked into a staging folder for `mkfs.ext4 -d`; the rest
# of the volume is free space that was never written.
#
# Usage: benches/compare/volume.sh [--data DIR] [--fill PERCENT] [--work DIR] [--ferry BIN]
#                                  [--kopia BIN|--no-kopia]
# Needs root (losetup, mount), mkfs.ext4, and a release build of ferry
# (cargo build --release -p ferry). Every loop device and mount is released on exit.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
DATA="${XDG_CACHE_HOME:-$HOME/.cache}/ferry/data/linux-source-6.1"
WORK_PARENT="${TMPDIR:-/tmp}"
FERRY="${CARGO_TARGET_DIR:-$ROOT/target}/release/ferry"
KOPIA="${XDG_CACHE_HOME:-$HOME/.cache}/ferry/anchors/kopia-v0.23.1/kopia"
SIZE=$((2 << 30))
FILL=50

while [[ $# -gt 0 ]]; do
  case "$1" in
    --data) DATA="$2"; shift 2 ;;
    --fill) FILL="$2"; shift 2 ;;
    --work) WORK_PARENT="$2"; shift 2 ;;
    --ferry) FERRY="$2"; shift 2 ;;
    --kopia) KOPIA="$2"; shift 2 ;;
    --no-kopia) KOPIA=""; shift ;;
    *) echo "volume.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
# The cache holds one folder per package version, the tree inside it (as run.sh extracts it).
if [[ -d "$DATA" && ! -e "$DATA/.complete" ]]; then
  found="$(ls -d "$DATA"/*/.complete 2>/dev/null | sort -V | tail -n 1 || true)"
  [[ -n "$found" ]] && DATA="$(dirname "$found")"
fi
[[ -d "$DATA" ]] || { echo "volume.sh: no data at $DATA (run run.sh once, or pass --data)" >&2; exit 1; }
[[ "$FILL" =~ ^[0-9]+$ && "$FILL" -ge 1 && "$FILL" -le 90 ]] ||
  { echo "volume.sh: --fill takes a percentage from 1 to 90" >&2; exit 2; }
[[ -x "$FERRY" ]] || { echo "volume.sh: no ferry binary at $FERRY" >&2; exit 1; }

WORK="$(mktemp -d "$WORK_PARENT/ferry-volume-bench.XXXXXX")"
DEV=""
cleanup() {
  mountpoint -q "$WORK/mnt" 2>/dev/null && umount "$WORK/mnt"
  [[ -n "$DEV" ]] && losetup -d "$DEV" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

export FERRY_PASSWORD=ferry-benchmark-password
REPO="file://$WORK/repo"
"$FERRY" repo init --repo "$REPO" >/dev/null

# The files to put on the volume, hard-linked (copied across file systems) in path order.
echo "volume: $(python3 "$HERE/helper.py" first-files "$DATA" "$WORK/data" --bytes "$((SIZE * FILL / 100))") ($FILL % of the volume)"
truncate -s "$SIZE" "$WORK/volume.img"
mkfs.ext4 -q -F -d "$WORK/data" "$WORK/volume.img"
rm -rf "$WORK/data"
echo "volume: $(du -B1 "$WORK/volume.img" | cut -f1 | python3 -c 'import sys; print(f"{int(sys.stdin.read()) / 1e9:.2f}")') GB of the image written by mkfs"
DEV="$(losetup --find --show "$WORK/volume.img")"
sync; echo 3 > /proc/sys/vm/drop_caches

gbps() { python3 -c "print(f'{$SIZE / $1 / 1e9:.2f}')"; }
timed() { # label, command...: prints the JSON summary's size fields and the rate
  local label="$1"; shift
  local t0 t1 secs
  t0=$(date +%s.%N); out="$("$@")"; t1=$(date +%s.%N)
  secs=$(python3 -c "print(f'{$t1 - $t0:.2f}')")
  echo "| $label | $secs s | $(gbps "$secs") GB/s | ${out:0:200} |"
}

echo "| step | wall | device GB/s | ferry output |"
echo "|---|---|---|---|"
first="$(mktemp)"
timed "first backup" "$FERRY" backup --repo "$REPO" --json "$DEV" | tee "$first"

if [[ -n "$KOPIA" && ! -x "$KOPIA" ]]; then
  echo "volume.sh: no kopia at $KOPIA (run run.sh once to build it, or pass --no-kopia)" >&2
  KOPIA=""
fi
kopia() { "$KOPIA" "$@" --config-file "$WORK/kopia/repository.config" --log-dir "$WORK/kopia/logs"; }
kopia_backup() { # reads the whole device as one file, as Velero's block uploader does
  kopia snapshot create - --stdin-file=volume.img --disable-file-logging --json < "$DEV" \
    > "$WORK/kopia.json"
}
if [[ -n "$KOPIA" ]]; then
  export KOPIA_PASSWORD=ferry-benchmark-password KOPIA_CHECK_FOR_UPDATES=false
  kopia repository create filesystem --path "$WORK/kopia-repo" --cache-directory "$WORK/kopia/cache" >/dev/null 2>&1
  kopia maintenance set --enable-quick=false --enable-full=false >/dev/null 2>&1
  sync; echo 3 > /proc/sys/vm/drop_caches
  timed "kopia: first backup" kopia_backup
fi
ID="$(grep -o '"snapshot_id":"[0-9a-f]*"' "$first" | cut -d'"' -f4)"

# 1 % of the files change: a line appended to every 100th file (sorted by path).
mkdir -p "$WORK/mnt"; mount "$DEV" "$WORK/mnt"
find "$WORK/mnt" -type f -size +0 | LC_ALL=C sort | awk 'NR % 100 == 0' |
  while read -r f; do echo "ferry benchmark change" >> "$f"; done
umount "$WORK/mnt"
sync; echo 3 > /proc/sys/vm/drop_caches

second="$(mktemp)"
timed "incremental (1 % of files changed)" "$FERRY" backup --repo "$REPO" --json --parent "$ID" "$DEV" | tee "$second"
if [[ -n "$KOPIA" ]]; then
  sync; echo 3 > /proc/sys/vm/drop_caches
  timed "kopia: incremental (1 % of files changed)" kopia_backup
  KID="$(python3 "$HERE/helper.py" snapshot-id --tool kopia "$WORK/kopia.json")"
fi
ID2="$(grep -o '"snapshot_id":"[0-9a-f]*"' "$second" | cut -d'"' -f4)"
sync; echo 3 > /proc/sys/vm/drop_caches
timed "restore onto a new image file" "$FERRY" restore --repo "$REPO" "$ID2" "$WORK/restored.img"
cmp "$WORK/restored.img" "$DEV" && echo "restored image identical to the device"
if [[ -n "$KOPIA" ]]; then
  sync; echo 3 > /proc/sys/vm/drop_caches
  # A stdin snapshot restores as a directory holding the file under its --stdin-file name.
  timed "kopia: restore onto a new image file" kopia snapshot restore "$KID" "$WORK/kopia-restored" --disable-file-logging
  cmp "$WORK/kopia-restored/volume.img" "$DEV" && echo "kopia's restored image identical to the device"
  echo "kopia repository: $(du -sh "$WORK/kopia-repo" | cut -f1)"
fi
echo "repository: $(du -sh "$WORK/repo" | cut -f1)"
rm -f "$first" "$second"
