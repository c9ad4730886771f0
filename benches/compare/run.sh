#!/usr/bin/env bash
# Ferry against kopia (Velero's uploader) and restic, in one run, on the same data and disk.
#
# For each run and each tool (the order rotates from run to run), on a fresh copy of the data:
#   first backup into an empty local repository, backup of the unchanged tree, backup after
#   a deterministic 1 % of the files changed, restore of that last snapshot into a freshly
#   made ext4 file system (as a restore into a newly provisioned volume; see --restore-dir);
#   the repository size after the first and after all three backups; the wall time
#   and peak RSS (/usr/bin/time -v) of every command. Medians over the runs go to stdout and,
#   with the machine, settings and every measurement, to benches/results/<date>-<host>.md.
#
# Usage: benches/compare/run.sh [--data DIR] [--runs N] [--tools ferry,kopia,restic]
#                               [--work DIR] [--timeout SECONDS] [--note TEXT] [--out FILE]
#                               [--no-verify] [--restore-dir] [--buffered-loop]
#                               [--remote RTT_MS/RATE_MBIT] [--s3-dir DIR] [--files N]
#                               [--volume] [--flat K]
# --restore-dir restores into a plain directory of the work area instead of a fresh ext4 file
# system on a loop device (which needs root, losetup and mkfs.ext4). That loop device reads and
# writes its image file with direct I/O, as a disk would; --buffered-loop makes it go through
# the page cache instead (each restored byte then copied a second time, into the image file's
# cache, and written back from there).
# --remote 20/1000 puts every repository in MinIO, reached over a path of 20 ms round trip and
# 1000 Mbit/s each way (netpath, a relay on loopback: this kernel has no netem), and counts the
# HTTP requests and bytes of every step; MinIO keeps its objects in --s3-dir (/dev/shm).
# --files 1000000 uses a synthetic tree of that many small files (helper.py gen-tree: about
# 2.9 KB a file, 1,000 per directory), generated once into the cache, and reports time per file.
# --flat K (with --files N): N empty files in K directories side by side instead (the cost of
# entries in large directories, not of bytes).
# --volume backs up a block device instead of a tree: a 2 GiB ext4 volume on a loop device, half
# full of the data's first files in path order (made once per run.sh, copied afresh for each
# tool). Ferry reads the device (`ferry backup DEV`); kopia and restic read it as one stream, as
# Velero's kopia uploader does for block volumes (`kopia snapshot create --stdin-file`, `restic
# backup --stdin`). The 1 % change is made to the files on the mounted volume. The restore goes
# onto a fresh block device of the volume's size (a loop device, direct I/O as above), compared
# with the source after: Ferry writes it (`ferry restore SNAP DEV`, as its agent restores a block
# PVC); kopia copies the file's content onto it in one stream (`kopia show OBJ >DEV`, what
# Velero's kopia block restore does: kopia's own restore refuses a device); restic, which can
# write a device only in one stream too (`restic dump --target DEV`), restores its image file
# into a fresh ext4 file system instead (on a loop device as for a tree), its fastest way.
# With --restore-dir, each tool restores an image file into a directory of the work area
# instead. Needs root, losetup and mkfs.ext4.
# Without --data or --files, the Linux 6.1 source tree from Debian's linux-source-6.1 package is used
# (downloaded and extracted once into the cache). See benches/README.md.
set -euo pipefail

KOPIA_VERSION=v0.23.1
RESTIC_VERSION=v0.19.1
LINUX_PACKAGE=linux-source-6.1
PASSWORD=ferry-benchmark-password
SEED=20250601

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
HELPER="$HERE/helper.py"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/ferry"
ANCHORS="$CACHE/anchors"
COMMAND_LINE="$(python3 -c 'import shlex, sys; print(shlex.join(sys.argv[1:]))' benches/compare/run.sh "$@")"

DATA=""
RUNS=3
TOOLS="ferry,kopia,restic"
WORK_PARENT="${TMPDIR:-/tmp}"
TIMEOUT=3600
NOTE=""
OUT=""
VERIFY=1
RESTORE_FS=1
RESTORE_DIO=1
REMOTE=""
S3_DIR=/dev/shm
FILES=""
FLAT=""
VOLUME=0
VOLUME_BYTES=$((2 << 30))
S3_KEY=ferry-bench
S3_SECRET=ferry-bench-secret

die() { echo "run.sh: $*" >&2; exit 1; }
say() { echo "== $*" >&2; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --data) DATA="$(cd "${2:?--data needs a directory}" && pwd)"; shift 2 ;;
    --runs) RUNS="${2:?}"; shift 2 ;;
    --tools) TOOLS="${2:?}"; shift 2 ;;
    --work) WORK_PARENT="${2:?}"; shift 2 ;;
    --timeout) TIMEOUT="${2:?}"; shift 2 ;;
    --note) NOTE="${2:?}"; shift 2 ;;
    --out) OUT="${2:?}"; shift 2 ;;
    --no-verify) VERIFY=0; shift ;;
    --restore-dir) RESTORE_FS=0; shift ;;
    --buffered-loop) RESTORE_DIO=0; shift ;;
    --remote) REMOTE="${2:?--remote needs RTT_MS/RATE_MBIT, for example 20/1000}"; shift 2 ;;
    --s3-dir) S3_DIR="${2:?--s3-dir needs a directory}"; shift 2 ;;
    --files) FILES="${2:?--files needs a number of files}"; shift 2 ;;
    --volume) VOLUME=1; shift ;;
    --flat) FLAT="${2:?--flat needs a number of directories}"; shift 2 ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
[[ "$RUNS" =~ ^[1-9][0-9]?$ ]] || die "--runs must be 1..99"
[[ -z "$FILES" || "$FILES" =~ ^[1-9][0-9]{0,8}$ ]] || die "--files must be 1..999999999"
[[ -z "$FILES" || -z "$DATA" ]] || die "--files and --data exclude each other"
[[ -z "$FLAT" || ( -n "$FILES" && "$FLAT" =~ ^[1-9][0-9]{0,5}$ ) ]] || die "--flat takes 1..999999 directories, with --files"
[[ "$TIMEOUT" =~ ^[1-9][0-9]*$ ]] || die "--timeout must be a positive number of seconds"
if [[ $VOLUME -eq 1 ]]; then
  [[ $(id -u) -eq 0 ]] || die "--volume needs root (losetup, mount)"
  command -v mkfs.ext4 >/dev/null && command -v losetup >/dev/null || die "--volume needs mkfs.ext4 and losetup"
fi
[[ $RESTORE_DIO -eq 1 || $RESTORE_FS -eq 1 ]] ||
  die "--buffered-loop sets up the restore's loop device: not with --restore-dir"
if [[ -n "$REMOTE" ]]; then
  [[ "$REMOTE" =~ ^([1-9][0-9]{0,3})/([1-9][0-9]{0,5})$ ]] ||
    die "--remote must be RTT_MS/RATE_MBIT, for example 20/1000"
  RTT_MS="${BASH_REMATCH[1]}"
  RATE_MBIT="${BASH_REMATCH[2]}"
  [[ -d "$S3_DIR" ]] || die "no directory $S3_DIR for MinIO's objects (--s3-dir)"
fi
IFS=',' read -r -a TOOL_LIST <<<"$TOOLS"
for t in "${TOOL_LIST[@]}"; do
  case "$t" in ferry|kopia|restic) ;; *) die "unknown tool $t" ;; esac
done

# ---------------------------------------------------------------- prerequisites
need_apt() {
  # Installs Debian packages that are missing (as root; otherwise says what is needed).
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  [[ $(id -u) -eq 0 ]] || die "please install: ${missing[*]}"
  timeout 600 apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1 ||
    { timeout 600 apt-get update >/dev/null && timeout 600 apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; } ||
    die "apt-get install ${missing[*]} failed"
}

command -v python3 >/dev/null || die "python3 is required"
[[ -x /usr/bin/time ]] || need_apt time

# Builds a Go command from the module proxy into $ANCHORS/<name>-<version>/<name>, once.
# A wrapper module that requires the pinned version is used instead of `go install pkg@v`,
# which also asks the proxy for the module's version list (some proxies refuse that).
build_go_tool() {
  local name="$1" module="$2" version="$3" package="$4"
  local dir="$ANCHORS/$name-$version" bin
  bin="$dir/$name"
  if [[ -x "$bin" ]]; then echo "$bin"; return 0; fi
  command -v go >/dev/null || die "go is required to build $name $version"
  say "building $name $version from the Go module proxy (once; cached in $dir)"
  mkdir -p "$dir"
  local mod
  mod="$(mktemp -d)"
  printf 'module ferry.invalid/anchors/%s\n\ngo 1.24\n\nrequire %s %s\n' "$name" "$module" "$version" >"$mod/go.mod"
  if ! (cd "$mod" && GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod timeout 1800 \
        go build -trimpath -o "$bin.partial" "$package") >&2; then
    rm -rf "$mod" "$bin.partial"
    die "building $name $version failed"
  fi
  rm -rf "$mod"
  mv "$bin.partial" "$bin"
  echo "$bin"
}

# The Linux source tree, extracted once into the cache, keyed by the package version.
linux_tree() {
  local base="$CACHE/data/$LINUX_PACKAGE" found
  found="$(ls -d "$base"/*/.complete 2>/dev/null | sort -V | tail -n 1 || true)"
  if [[ -n "$found" ]]; then dirname "$found"; return 0; fi
  need_apt dpkg xz-utils
  local dl version dest
  dl="$(mktemp -d)"
  say "downloading $LINUX_PACKAGE with apt-get (once; cached in $base)"
  (cd "$dl" && { timeout 900 apt-get download "$LINUX_PACKAGE" >/dev/null 2>&1 ||
    { timeout 600 apt-get update >/dev/null && timeout 900 apt-get download "$LINUX_PACKAGE" >/dev/null; }; }) ||
    { rm -rf "$dl"; die "apt-get download $LINUX_PACKAGE failed"; }
  local deb
  deb="$(ls "$dl"/*.deb)"
  version="$(dpkg-deb -f "$deb" Version)"
  dest="$base/$version"
  rm -rf "$dest"
  mkdir -p "$dest"
  dpkg-deb -x "$deb" "$dl/x"
  say "extracting $LINUX_PACKAGE $version"
  timeout 1800 tar -xf "$dl/x/usr/src/$LINUX_PACKAGE.tar.xz" -C "$dest"
  rm -rf "$dl"
  touch "$dest/.complete"
  echo "$dest"
}

# A synthetic tree of $FILES small files, generated once into the cache (deterministic).
synthetic_tree() {
  local base="$CACHE/data/synthetic-$FILES-seed$SEED"
  [[ -z "$FLAT" ]] || base="$CACHE/data/synthetic-$FILES-empty-in-$FLAT-dirs"
  if [[ -e "$base/.complete" ]]; then echo "$base/tree"; return 0; fi
  rm -rf "$base"
  mkdir -p "$base"
  say "generating a synthetic tree of $FILES files (once; cached in $base)"
  timeout "$TIMEOUT" python3 "$HELPER" gen-tree "$base/tree" --files "$FILES" --seed "$SEED" ${FLAT:+--dirs "$FLAT"} >&2 ||
    { rm -rf "$base"; die "generating the synthetic tree failed"; }
  touch "$base/.complete"
  echo "$base/tree"
}

want() { [[ ",$TOOLS," == *",$1,"* ]]; }

declare -A VERSION
if [[ -n "$REMOTE" ]]; then
  # shellcheck source=benches/compare/minio.sh
  . "$HERE/minio.sh"
  MINIO="$(minio_binary)" || die "building MinIO failed"
  say "building netpath (cargo build --release -p ferry-benches --bin netpath)"
  (cd "$ROOT" && timeout 3600 cargo build --release -p ferry-benches --bin netpath) >&2 ||
    die "cargo build --release -p ferry-benches --bin netpath failed"
  NETPATH="${CARGO_TARGET_DIR:-$ROOT/target}/release/netpath"
fi
if want ferry; then
  say "building ferry (cargo build --release -p ferry)"
  (cd "$ROOT" && timeout 3600 cargo build --release -p ferry) >&2 || die "cargo build --release -p ferry failed"
  FERRY="${CARGO_TARGET_DIR:-$ROOT/target}/release/ferry"
  VERSION[ferry]="$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)$(cd "$ROOT" && git diff --quiet HEAD 2>/dev/null || echo '+changes')"
fi
if want kopia; then
  KOPIA="$(build_go_tool kopia github.com/kopia/kopia "$KOPIA_VERSION" github.com/kopia/kopia)"
  VERSION[kopia]="$KOPIA_VERSION"
fi
if want restic; then
  RESTIC="$(build_go_tool restic github.com/restic/restic "$RESTIC_VERSION" github.com/restic/restic/cmd/restic)"
  VERSION[restic]="$RESTIC_VERSION"
fi

if [[ -n "$DATA" ]]; then
  DATA_LABEL="$DATA"
elif [[ -n "$FILES" ]]; then
  DATA="$(synthetic_tree)"
  DATA_LABEL="a synthetic tree of $FILES small files (helper.py gen-tree, seed $SEED)"
  [[ -z "$FLAT" ]] || DATA_LABEL="$FILES empty files in $FLAT directories (helper.py gen-tree --dirs $FLAT)"
else
  LINUX_BASE="$(linux_tree)"
  DATA="$LINUX_BASE/$LINUX_PACKAGE"
  DATA_LABEL="Debian $LINUX_PACKAGE $(basename "$LINUX_BASE") (the extracted .tar.xz)"
fi
[[ -d "$DATA" ]] || die "no data directory $DATA"

# ---------------------------------------------------------------- work area, cleanup
mkdir -p "$WORK_PARENT"
WORK="$(mktemp -d "$WORK_PARENT/ferry-compare.XXXXXX")"
cleanup() { unmount_restore; release_volume; stop_remote; rm -rf "$WORK"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
RESULTS="$WORK/results.jsonl"
: >"$RESULTS"
SRC="$WORK/src"

measure() { # tool run metric [--stdout F] -- command...
  local tool="$1" run="$2" metric="$3"; shift 3
  [[ -z "$REMOTE" ]] || path_counts "$WORK/path.before"
  python3 "$HELPER" measure --results "$RESULTS" --tool "$tool" --run "$run" --metric "$metric" \
    --timeout "$TIMEOUT" --stderr "$WORK/$tool-$metric.err" "$@"
  if [[ -n "$REMOTE" ]]; then
    path_counts "$WORK/path.after"
    python3 "$HELPER" record-path --results "$RESULTS" --tool "$tool" --run "$run" --metric "$metric" \
      --before "$WORK/path.before" --after "$WORK/path.after"
  fi
}
# The sync of the restore's file system right after a restore, timed on its own (no path counts:
# nothing crosses the path). Ferry's restore ends with syncfs, so its data is on disk when it
# reports success; kopia and restic leave their writes in the page cache. The restore plus this
# is every tool's time until the restored data is on disk.
# A restore onto a device (--volume) is flushed by fsync of the device (`sync DEV`: syncfs of
# a device node would flush the file system /dev is on instead).
settle_restore() {
  local what=(sync -f "$RESTORE")
  [[ -z "$RESTORE_DEV" ]] || what=(sync "$RESTORE_DEV")
  python3 "$HELPER" measure --results "$RESULTS" --tool "$1" --run "$2" --metric restore_sync \
    --timeout "$TIMEOUT" -- "${what[@]}"
}
record() { python3 "$HELPER" record --results "$RESULTS" --tool "$1" --run "$2" --metric "$3" --value "$4"; }
# A repository's bytes: its folder, or with --remote its bucket's folder in MinIO's data folder
# (object data and MinIO's per-object metadata).
repo_bytes() { du -sb "$1" | cut -f1; }

# ---------------------------------------------------------------- the S3 path (--remote)
S3_PID=""
PATH_PID=""
S3_DATA=""
S3_DIRECT=""
start_remote() {
  local port console
  S3_DATA="$(mktemp -d "$S3_DIR/ferry-compare-s3.XXXXXX")"
  port="$(python3 "$HELPER" free-port)"
  console="$(python3 "$HELPER" free-port)"
  MINIO_ROOT_USER="$S3_KEY" MINIO_ROOT_PASSWORD="$S3_SECRET" MINIO_BROWSER=off MINIO_UPDATE=off \
    "$MINIO" server --quiet --address "127.0.0.1:$port" --console-address "127.0.0.1:$console" \
    "$S3_DATA" >"$WORK/minio.log" 2>&1 &
  S3_PID=$!
  python3 "$HELPER" wait-http "http://127.0.0.1:$port/minio/health/live" --timeout 60 ||
    { cat "$WORK/minio.log" >&2; die "MinIO did not start"; }
  S3_DIRECT="http://127.0.0.1:$port"
  "$NETPATH" --upstream "127.0.0.1:$port" --rtt-ms "$RTT_MS" --rate-mbit "$RATE_MBIT" \
    --stats "$WORK/path.json" --ready-file "$WORK/path.addr" >"$WORK/netpath.log" 2>&1 &
  PATH_PID=$!
  for _ in $(seq 1 100); do
    [[ -s "$WORK/path.addr" ]] || ! kill -0 "$PATH_PID" 2>/dev/null && break
    sleep 0.1
  done
  [[ -s "$WORK/path.addr" ]] || { cat "$WORK/netpath.log" >&2; die "netpath did not start"; }
  ENDPOINT_HOST="$(cat "$WORK/path.addr")"
  ENDPOINT="http://$ENDPOINT_HOST"
  say "MinIO (pid $S3_PID, objects in $S3_DATA) behind netpath at $ENDPOINT: ${RTT_MS} ms round trip, ${RATE_MBIT} Mbit/s each way"
}
stop_remote() {
  local pid
  for pid in "$PATH_PID" "$S3_PID"; do
    if [[ -n "$pid" ]]; then
      kill "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
  PATH_PID=""
  S3_PID=""
  if [[ -n "$S3_DATA" ]]; then rm -rf "$S3_DATA"; fi
  S3_DATA=""
}
# The path's counts so far, into $1 (netpath writes them on SIGUSR1).
path_counts() {
  rm -f "$WORK/path.json"
  kill -USR1 "$PATH_PID" || die "netpath is gone (see $WORK/netpath.log)"
  for _ in $(seq 1 100); do
    [[ -s "$WORK/path.json" ]] && break
    sleep 0.05
  done
  [[ -s "$WORK/path.json" ]] || die "netpath wrote no counts"
  mv "$WORK/path.json" "$1"
}
# A new, empty bucket for one tool's run, made over S3 straight at MinIO (not across the path,
# whose counts are the tools'); prints its name.
new_bucket() {
  AWS_ACCESS_KEY_ID="$S3_KEY" AWS_SECRET_ACCESS_KEY="$S3_SECRET" \
    python3 "$HELPER" make-bucket --endpoint "$S3_DIRECT" "$1-run$2" >&2 ||
    die "could not create bucket $1-run$2 in MinIO"
  echo "$1-run$2"
}

# The restore target. By default a new ext4 file system on a loop device, made before each
# restore: a restore goes into a newly provisioned volume, and a directory on the work disk
# would make the tools pay for its history instead (ext4 without a journal, as this VM's root
# is, scans past every inode freed in the last 5 minutes when it allocates one: restores right
# after the previous tool's files were deleted took 3 s, 28 s, then 51 s for the same data).
# The loop device uses direct I/O to its image file: a volume is a disk (or a directory of the
# node's file system), with one page cache above it; a buffered loop device adds a second one,
# whose copies and write-back cost the restores CPU and time no real volume costs them
# (the Linux tree until on disk, 2 cores: Ferry 2.89 against 3.19 s, kopia 19.05 against
# 23.37 s; benches/results/2026-12-01-vm-local-restore-target-direct-io.md).
RESTORE="$WORK/restore"
RESTORE_LOOP=""
RESTORE_DEV="" # with --volume, the fresh block device a restore writes (mount_restore device)
# Attaches the image $1 to a free loop device (RESTORE_LOOP), with direct I/O unless
# --buffered-loop. losetup only warns when the image's file system refuses direct I/O: fail
# instead, never measure something else than the report says.
attach_restore_loop() {
  if [[ $RESTORE_DIO -ne 1 ]]; then
    RESTORE_LOOP="$(losetup --find --show "$1")"
    return 0
  fi
  RESTORE_LOOP="$(losetup --direct-io=on --find --show "$1")" ||
    die "losetup --direct-io=on refused $1 (pass --buffered-loop)"
  if [[ "$(losetup --list --noheadings --output DIO "$RESTORE_LOOP" | tr -d ' ')" != 1 ]]; then
    losetup -d "$RESTORE_LOOP" || true
    RESTORE_LOOP=""
    die "a loop device over $1 could not use direct I/O (pass --buffered-loop, or a --work on another file system)"
  fi
}
# mount_restore [device]: with `device` (--volume), a fresh block device of the volume's size
# (RESTORE_DEV), all zeros, instead of a file system.
mount_restore() {
  # A plain directory shares the work area's file system: flush the steps before, so the timed
  # restore and its sync write only the restore's own data.
  if [[ $RESTORE_FS -ne 1 ]]; then
    [[ $VOLUME -eq 0 ]] || mkdir -p "$RESTORE"
    sync
    return 0
  fi
  local image="$WORK/restore.img" bytes entries
  if [[ "${1:-}" == device ]]; then
    rm -f "$image"
    truncate -s "$VOLUME_BYTES" "$image"
    attach_restore_loop "$image"
    RESTORE_DEV="$RESTORE_LOOP"
    sync
    return 0
  fi
  bytes="$(du -sb "$SRC" | cut -f1)"
  entries="$(find "$SRC" | wc -l)"
  # A volume's restore is an image file of the volume's size (du sees 0 bytes in a device): a
  # file system sized from du held 1 GiB for a 2 GiB volume, nearly full after a restore.
  [[ $VOLUME -eq 0 ]] || bytes=$VOLUME_BYTES
  # Inode tables and journal written now, so no background initialisation runs during the
  # restore. Inodes for twice the tree's entries (mkfs's default of one per 16 KiB is too few
  # for trees of many small files), and at least mkfs's default; the image (sparse) large
  # enough for them (inode tables, directory blocks) whatever the bytes.
  local size=$((bytes * 3 + (1 << 30)))
  local inodes=$((size >> 14))
  ((inodes >= entries * 2)) || inodes=$((entries * 2))
  ((size >= inodes * 2048)) || size=$((inodes * 2048))
  truncate -s "$(((size >> 20) + 1))M" "$image"
  quiet mkfs.ext4 -q -F -N "$inodes" -E lazy_itable_init=0,lazy_journal_init=0 "$image"
  attach_restore_loop "$image"
  mkdir -p "$RESTORE"
  mount "$RESTORE_LOOP" "$RESTORE"
  sync
  # The target itself is a fresh, empty directory on it (the tools want to create it or
  # find it empty).
  RESTORE="$WORK/restore/target"
}
unmount_restore() {
  RESTORE="$WORK/restore"
  RESTORE_DEV=""
  [[ -n "$RESTORE_LOOP" ]] || return 0
  if mountpoint -q "$RESTORE"; then umount "$RESTORE" || umount -l "$RESTORE" || true; fi
  losetup -d "$RESTORE_LOOP" 2>/dev/null || true
  RESTORE_LOOP=""
  rm -f "$WORK/restore.img"
}
quiet() { # runs a setup command, bounded; shows its output only if it fails
  local log="$WORK/setup.log"
  timeout "$TIMEOUT" "$@" >"$log" 2>&1 || { cat "$log" >&2; die "setup command failed: $*"; }
}

# ---------------------------------------------------------------- the volume (--volume)
VOLUME_LOOP=""
VOLUME_BASE="$WORK/volume.base.img"
# The volume's image, made once: the data's first files in path order, up to half the volume.
make_volume() {
  local files
  files="$(python3 "$HELPER" first-files "$DATA" "$WORK/volume.files" --bytes "$((VOLUME_BYTES / 2))")"
  say "volume: $files on a $((VOLUME_BYTES >> 30)) GiB ext4 volume"
  truncate -s "$VOLUME_BYTES" "$VOLUME_BASE"
  quiet mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 -d "$WORK/volume.files" "$VOLUME_BASE"
  rm -rf "$WORK/volume.files"
}
# A fresh copy of the volume on a loop device, in $SRC.
fresh_volume() {
  release_volume
  cp --sparse=always "$VOLUME_BASE" "$WORK/volume.img"
  VOLUME_LOOP="$(losetup --find --show "$WORK/volume.img")"
  SRC="$VOLUME_LOOP"
  # Warm-up read, as for a tree.
  cat "$SRC" >/dev/null
}
release_volume() {
  if [[ -n "$VOLUME_LOOP" ]]; then
    mountpoint -q "$WORK/mnt" 2>/dev/null && umount "$WORK/mnt"
    losetup -d "$VOLUME_LOOP" 2>/dev/null || true
    VOLUME_LOOP=""
  fi
  rm -f "$WORK/volume.img"
}
# 1 % of the volume's files changed, as mutate does to a tree, on the mounted volume.
mutate_volume() {
  mkdir -p "$WORK/mnt"
  mount "$SRC" "$WORK/mnt"
  MUTATION="$(python3 "$HELPER" mutate "$WORK/mnt" --seed "$((SEED + $1))" --percent 1)"
  umount "$WORK/mnt"
  sync
}
# Prefix of a command that reads the device given after it as its standard input.
FROM_VOLUME=(bash -c 'exec "${@:2}" <"$1"' from-volume)
verify_volume() {
  cmp "$1" "$SRC" >"$WORK/diff.txt" 2>&1 || { cat "$WORK/diff.txt" >&2; die "$2 restored an image that differs from the volume"; }
}

# ---------------------------------------------------------------- one tool, one run
run_ferry() {
  local run="$1" dir="$WORK/ferry-repo" url out="$WORK/ferry.out" first second third
  export FERRY_PASSWORD="$PASSWORD"
  url="file://$dir"
  if [[ -n "$REMOTE" ]]; then
    local bucket
    bucket="$(new_bucket ferry "$run")"
    dir="$S3_DATA/$bucket"
    url="s3://$bucket/repo"
    export FERRY_S3_ENDPOINT="$ENDPOINT" FERRY_S3_REGION=us-east-1 FERRY_CACHE_DIR="$WORK/ferry-cache" \
      AWS_ACCESS_KEY_ID="$S3_KEY" AWS_SECRET_ACCESS_KEY="$S3_SECRET"
  fi
  quiet "$FERRY" repo init --repo "$url"
  measure ferry "$run" backup_first --stdout "$out" -- "$FERRY" backup --repo "$url" --json "$SRC"
  first="$(python3 "$HELPER" snapshot-id --tool ferry "$out")"
  record ferry "$run" repo_bytes_first "$(repo_bytes "$dir")"
  measure ferry "$run" backup_unchanged --stdout "$out" -- "$FERRY" backup --repo "$url" --parent "$first" --json "$SRC"
  second="$(python3 "$HELPER" snapshot-id --tool ferry "$out")"
  mutate "$run"
  measure ferry "$run" backup_changed --stdout "$out" -- "$FERRY" backup --repo "$url" --parent "$second" --json "$SRC"
  third="$(python3 "$HELPER" snapshot-id --tool ferry "$out")"
  record ferry "$run" repo_bytes_all "$(repo_bytes "$dir")"
  # mount_restore sets RESTORE (a fresh file system's target directory) or RESTORE_DEV.
  local target restored
  if [[ $VOLUME -eq 1 && $RESTORE_FS -eq 1 ]]; then
    mount_restore device
    target="$RESTORE_DEV" restored="$RESTORE_DEV"
  else
    mount_restore
    target="$RESTORE" restored="$RESTORE"
    [[ $VOLUME -eq 0 ]] || target="$RESTORE/volume.img"
  fi
  measure ferry "$run" restore -- "$FERRY" restore --repo "$url" "$third" "$target"
  settle_restore ferry "$run"
  verify "$restored" ferry
  unmount_restore
  unset FERRY_PASSWORD FERRY_S3_ENDPOINT FERRY_S3_REGION FERRY_CACHE_DIR AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
}

run_kopia() {
  local run="$1" repo="$WORK/kopia-repo" out="$WORK/kopia.out" third
  local common=(--config-file "$WORK/kopia/repository.config" --log-dir "$WORK/kopia/logs")
  export KOPIA_PASSWORD="$PASSWORD" KOPIA_CHECK_FOR_UPDATES=false
  if [[ -n "$REMOTE" ]]; then
    local bucket
    bucket="$(new_bucket kopia "$run")"
    repo="$S3_DATA/$bucket"
    quiet "$KOPIA" repository create s3 --bucket "$bucket" --endpoint "$ENDPOINT_HOST" --disable-tls \
      --access-key "$S3_KEY" --secret-access-key "$S3_SECRET" --region us-east-1 \
      --cache-directory "$WORK/kopia/cache" "${common[@]}"
  else
    quiet "$KOPIA" repository create filesystem --path "$repo" --cache-directory "$WORK/kopia/cache" "${common[@]}"
  fi
  quiet "$KOPIA" maintenance set --enable-quick=false --enable-full=false "${common[@]}"
  local snap=("$KOPIA" snapshot create "$SRC" --json --disable-file-logging "${common[@]}")
  [[ $VOLUME -eq 0 ]] ||
    snap=("${FROM_VOLUME[@]}" "$SRC" "$KOPIA" snapshot create - --stdin-file=volume.img --json --disable-file-logging "${common[@]}")
  measure kopia "$run" backup_first --stdout "$out" -- "${snap[@]}"
  python3 "$HELPER" snapshot-id --tool kopia "$out" >/dev/null
  record kopia "$run" repo_bytes_first "$(repo_bytes "$repo")"
  measure kopia "$run" backup_unchanged --stdout "$out" -- "${snap[@]}"
  mutate "$run"
  measure kopia "$run" backup_changed --stdout "$out" -- "${snap[@]}"
  third="$(python3 "$HELPER" snapshot-id --tool kopia "$out")"
  record kopia "$run" repo_bytes_all "$(repo_bytes "$repo")"
  if [[ $VOLUME -eq 1 && $RESTORE_FS -eq 1 ]]; then
    # The image file's content in one stream onto the device, as Velero's block restore copies
    # it (kopia's own restore refuses a device: it truncates its target).
    local root
    root="$(python3 "$HELPER" snapshot-id --tool kopia --root-object "$out")"
    mount_restore device
    measure kopia "$run" restore -- bash -c '[[ -b "$1" ]] || { echo "$1: no block device" >&2; exit 1; }; exec "${@:2}" >"$1"' to-device "$RESTORE_DEV" \
      "$KOPIA" show "$root/volume.img" --disable-file-logging "${common[@]}"
    settle_restore kopia "$run"
    verify "$RESTORE_DEV" kopia
  else
    mount_restore
    measure kopia "$run" restore -- "$KOPIA" snapshot restore "$third" "$RESTORE" --disable-file-logging "${common[@]}"
    settle_restore kopia "$run"
    verify "$RESTORE" kopia
  fi
  unmount_restore
  unset KOPIA_PASSWORD
}

run_restic() {
  local run="$1" out="$WORK/restic.out" third
  export RESTIC_PASSWORD="$PASSWORD" RESTIC_REPOSITORY="$WORK/restic-repo" RESTIC_CACHE_DIR="$WORK/restic-cache"
  local dir="$RESTIC_REPOSITORY"
  if [[ -n "$REMOTE" ]]; then
    local bucket
    bucket="$(new_bucket restic "$run")"
    dir="$S3_DATA/$bucket"
    export RESTIC_REPOSITORY="s3:$ENDPOINT/$bucket" AWS_DEFAULT_REGION=us-east-1 \
      AWS_ACCESS_KEY_ID="$S3_KEY" AWS_SECRET_ACCESS_KEY="$S3_SECRET"
  fi
  quiet "$RESTIC" init
  local snap=("$RESTIC" backup --json "$SRC")
  [[ $VOLUME -eq 0 ]] || snap=("${FROM_VOLUME[@]}" "$SRC" "$RESTIC" backup --json --stdin --stdin-filename volume.img)
  measure restic "$run" backup_first --stdout "$out" -- "${snap[@]}"
  python3 "$HELPER" snapshot-id --tool restic "$out" >/dev/null
  record restic "$run" repo_bytes_first "$(repo_bytes "$dir")"
  measure restic "$run" backup_unchanged --stdout "$out" -- "${snap[@]}"
  mutate "$run"
  measure restic "$run" backup_changed --stdout "$out" -- "${snap[@]}"
  third="$(python3 "$HELPER" snapshot-id --tool restic "$out")"
  record restic "$run" repo_bytes_all "$(repo_bytes "$dir")"
  # `ID:PATH` restores the backed-up directory's content directly into the target (a volume's
  # snapshot holds the one file).
  local what="$third:$SRC"
  [[ $VOLUME -eq 0 ]] || what="$third"
  mount_restore
  measure restic "$run" restore -- "$RESTIC" restore "$what" --target "$RESTORE"
  settle_restore restic "$run"
  verify "$RESTORE" restic
  unmount_restore
  unset RESTIC_PASSWORD RESTIC_REPOSITORY RESTIC_CACHE_DIR AWS_DEFAULT_REGION AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
}

MUTATION=""
mutate() {
  if [[ $VOLUME -eq 1 ]]; then mutate_volume "$1"; return; fi
  local summary
  summary="$(python3 "$HELPER" mutate "$SRC" --seed "$((SEED + $1))" --percent 1)"
  MUTATION="$summary"
}

verify() {
  [[ $VERIFY -eq 1 ]] || return 0
  if [[ $VOLUME -eq 1 ]]; then
    # A device, or a directory holding the restored image file.
    if [[ -b "$1" ]]; then verify_volume "$1" "$2"; else verify_volume "$1/volume.img" "$2"; fi
    return
  fi
  if ! timeout "$TIMEOUT" diff -r --no-dereference -q "$SRC" "$1" >"$WORK/diff.txt" 2>&1; then
    head -n 20 "$WORK/diff.txt" >&2
    die "$2 restored a tree that differs from the source (first differences above)"
  fi
}

fresh_copy() {
  [[ $VOLUME -eq 1 ]] || rm -rf "$SRC"
  rm -rf "$WORK/restore" "$WORK"/*-repo "$WORK/kopia" "$WORK/restic-cache" "$WORK/ferry-cache"
  if [[ -n "$S3_DATA" ]]; then rm -rf "${S3_DATA:?}"/*-run*; fi
  if [[ $VOLUME -eq 1 ]]; then fresh_volume; return; fi
  cp -a "$DATA" "$SRC"
  sync
  # Warm-up read: every tool then starts with the data in the page cache.
  find "$SRC" -type f -print0 | xargs -0 -r cat >/dev/null
}

# ---------------------------------------------------------------- the runs
[[ -z "$REMOTE" ]] || start_remote
if [[ $RESTORE_FS -eq 1 ]]; then
  [[ $(id -u) -eq 0 ]] || die "restoring into a fresh file system needs root (or pass --restore-dir)"
  command -v mkfs.ext4 >/dev/null && command -v losetup >/dev/null ||
    die "restoring into a fresh file system needs mkfs.ext4 and losetup (or pass --restore-dir)"
  # Now rather than at the first restore, after the first tool's backups (here, below every
  # function the EXIT trap's cleanup calls).
  truncate -s 16M "$WORK/probe.img"
  attach_restore_loop "$WORK/probe.img"
  losetup -d "$RESTORE_LOOP"
  RESTORE_LOOP=""
  rm -f "$WORK/probe.img"
fi
if [[ $VOLUME -eq 1 ]]; then
  make_volume
  DATA_LABEL="a $((VOLUME_BYTES >> 30)) GiB ext4 volume (block device) half full of the first files of $DATA_LABEL"
fi
read -r LOAD_BEFORE < <(cut -d' ' -f1-3 /proc/loadavg)
DATA_STATS="$(python3 "$HELPER" stats "$DATA")"
say "data: $DATA_LABEL $DATA_STATS; work area $WORK; $RUNS run(s) of ${TOOL_LIST[*]}"
for ((run = 1; run <= RUNS; run++)); do
  n=${#TOOL_LIST[@]}
  for ((i = 0; i < n; i++)); do
    tool="${TOOL_LIST[$(((i + run - 1) % n))]}"
    say "run $run/$RUNS: $tool"
    fresh_copy
    "run_$tool" "$run"
  done
done
if [[ $VOLUME -eq 1 ]]; then release_volume; else rm -rf "$SRC"; fi
rm -rf "$WORK/restore" "$WORK"/*-repo "$VOLUME_BASE"
[[ -z "$REMOTE" ]] || grep -h . "$WORK/netpath.log" >&2 || true
stop_remote
read -r LOAD_AFTER < <(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------- report
HOST="$(hostname 2>/dev/null || cat /proc/sys/kernel/hostname)"
DATE="$(date +%Y-%m-%d)"
if [[ -z "$OUT" ]]; then
  mkdir -p "$ROOT/benches/results"
  name="$DATE-$HOST"
  [[ -z "$REMOTE" ]] || name="$name-remote-${RTT_MS}ms-${RATE_MBIT}mbit"
  [[ $VOLUME -eq 0 ]] || name="$name-volume"
  OUT="$ROOT/benches/results/$name.md"
  [[ -e "$OUT" ]] && OUT="$ROOT/benches/results/$name-$(date +%H%M%S).md"
fi
disk="$(df -h --output=source,fstype,size "$WORK" | tail -n 1 | tr -s ' ')"
CPU="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')" \
MEMORY="$(free -h | awk '/^Mem:/ {print $2 " total, " $7 " available at the end"}')" \
KERNEL="$(uname -srm)" DISK="$disk" NPROC="$(nproc)" \
DATE="$DATE" HOST="$HOST" RUNS="$RUNS" NOTE="$NOTE" COMMAND_LINE="$COMMAND_LINE" \
DATA_STATS="$DATA_STATS" DATA_LABEL="$DATA_LABEL" MUTATION="$MUTATION" VERIFY="$VERIFY" \
RESTORE_FS="$RESTORE_FS" RESTORE_DIO="$RESTORE_DIO" REMOTE="$REMOTE" VOLUME="$VOLUME" \
TIMEOUT="$TIMEOUT" LOAD_BEFORE="$LOAD_BEFORE" LOAD_AFTER="$LOAD_AFTER" \
V_FERRY="${VERSION[ferry]:-}" V_KOPIA="${VERSION[kopia]:-}" V_RESTIC="${VERSION[restic]:-}" \
  python3 "$HELPER" meta >"$WORK/meta.json"
python3 "$HELPER" report --results "$RESULTS" --meta "$WORK/meta.json" --out "$OUT"
echo
echo "Written to ${OUT#"$ROOT"/}"
