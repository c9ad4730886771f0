#!/usr/bin/env bash
# How Ferry's costs grow with the number of snapshots in a repository and with the number of
# backups writing to it at once (#21's "snapshots" and "writers"), on a local repository.
#
# Snapshots: a synthetic tree (helper.py gen-tree) is backed up again and again into one
# repository, each time after 1 % of its files changed (helper.py mutate, a new seed each
# time; `--parent latest`), so every snapshot has its own root and the tree pages of the
# directories that changed. At each count in --counts: `ferry snapshots`, `ferry stats`,
# `ferry check`, `ferry gc` (nothing forgotten: the mark walks every snapshot, the sweep finds
# nothing) and a no-change backup are timed, with their peak RSS.
#
# Writers: K backups of K different trees of --writer-files files (other seeds) started at once
# into one new repository, for each K in --writers: the wall time until all are done, and each
# one's peak RSS and time.
#
# Usage: benches/compare/growth.sh [--files N] [--counts 1,10,100,1000] [--writers 1,2,4]
#                                  [--writer-files N] [--work DIR] [--ferry BIN] [--out FILE]
# Needs python3 and /usr/bin/time; builds ferry (cargo build --release -p ferry) unless --ferry
# is given. Everything is made in a new folder under --work and deleted on exit.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
FILES=10000
COUNTS="1,10,100,1000"
WRITERS="1,2,4"
WRITER_FILES=100000
WORK_PARENT="${TMPDIR:-/tmp}"
FERRY=""
OUT=""

while [[ $# -gt 0 ]]; do
  [[ $# -ge 2 ]] || { echo "growth.sh: $1 needs a value" >&2; exit 2; }
  case "$1" in
    --files) FILES="$2"; shift 2 ;;
    --counts) COUNTS="$2"; shift 2 ;;
    --writers) WRITERS="$2"; shift 2 ;;
    --writer-files) WRITER_FILES="$2"; shift 2 ;;
    --work) WORK_PARENT="$2"; shift 2 ;;
    --ferry) FERRY="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    *) echo "growth.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
for list in "$COUNTS" "$WRITERS"; do
  [[ "$list" =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "growth.sh: $list is no list of counts" >&2; exit 2; }
done
for n in "$FILES" "$WRITER_FILES"; do
  [[ "$n" =~ ^[0-9]+$ && "$n" -ge 100 ]] || { echo "growth.sh: --files and --writer-files take 100 or more" >&2; exit 2; }
done
[[ -x /usr/bin/time ]] || { echo "growth.sh: needs /usr/bin/time (GNU time)" >&2; exit 1; }
if [[ -z "$FERRY" ]]; then
  echo "== building ferry (cargo build --release -p ferry)" >&2
  (cd "$ROOT" && timeout 3600 cargo build --release -p ferry) >&2
  FERRY="${CARGO_TARGET_DIR:-$ROOT/target}/release/ferry"
fi
[[ -x "$FERRY" ]] || { echo "growth.sh: no ferry binary at $FERRY" >&2; exit 1; }

WORK="$(mktemp -d "$WORK_PARENT/ferry-growth.XXXXXX")"
pids=()
# Writers still running (one of them failed) are stopped before their folder goes: each
# `ferry` by its PID (the child of its /usr/bin/time), then its /usr/bin/time.
cleanup() {
  local p children
  for p in "${pids[@]}"; do
    children="$(cat /proc/"$p"/task/*/children 2>/dev/null || true)"
    if [[ -n "$children" ]]; then
      # shellcheck disable=SC2086
      kill $children 2>/dev/null || true
    fi
    kill "$p" 2>/dev/null || true
  done
  if [[ ${#pids[@]} -gt 0 ]]; then
    wait "${pids[@]}" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
export FERRY_PASSWORD=ferry-benchmark-password
REPORT="$WORK/report.md"

# Runs a command under /usr/bin/time; prints "seconds peak-RSS-MiB" (the command's output to
# $WORK/last.out, its errors to $WORK/last.err; a failure stops the run with them, so call it
# in the script's own shell, not in a substitution).
timed() {
  if ! /usr/bin/time -f '%e %M' -o "$WORK/time" "$@" >"$WORK/last.out" 2>"$WORK/last.err"; then
    echo "growth.sh: $* failed:" >&2
    cat "$WORK/last.err" >&2
    exit 1
  fi
  awk '{ printf "%.2f %d\n", $1, $2 / 1024 }' "$WORK/time"
}

echo "== a tree of $FILES files" >&2
python3 "$HERE/helper.py" gen-tree --files "$FILES" --seed 1 "$WORK/tree" >&2
REPO="file://$WORK/repo"
timed "$FERRY" repo init --repo "$REPO" >/dev/null

{
  echo "# How costs grow with snapshots and concurrent writers — $(date -u +%F) on $(hostname)"
  echo
  echo "Ferry $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- crates || echo +changes);"
  echo "a synthetic tree of $FILES files (helper.py gen-tree --seed 1); repository: local, on the"
  echo "work folder's file system ($(df --output=source,fstype "$WORK" | tail -n 1 | tr -s ' ')). CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -n 1),"
  echo "$(nproc) cores; kernel $(uname -r)."
  echo
  echo "Command: \`benches/compare/growth.sh --files $FILES --counts $COUNTS --writers $WRITERS --writer-files $WRITER_FILES\`"
  echo
  echo "## Snapshots"
  echo
  echo "Each snapshot after 1 % of the files changed (\`--parent latest\`). Seconds and peak RSS (MiB)"
  echo "of each command with that many snapshots in the repository:"
  echo
  echo "| snapshots | repository (MB) | snapshots (s / MiB) | stats (s / MiB) | check (s / MiB) | gc (s / MiB) | no-change backup (s / MiB) | the backups to get here (s, mean; 1 %-changed but the first) |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
} >"$REPORT"

made=0
for count in ${COUNTS//,/ }; do
  batch=0
  spent=0
  while (( made < count )); do
    made=$((made + 1))
    if (( made > 1 )); then
      python3 "$HERE/helper.py" mutate --seed "$made" --percent 1 "$WORK/tree" >/dev/null
    fi
    timed "$FERRY" backup --repo "$REPO" --parent latest "$WORK/tree" >"$WORK/measured"
    read -r s _ <"$WORK/measured"
    spent=$(awk -v a="$spent" -v b="$s" 'BEGIN { print a + b }')
    batch=$((batch + 1))
  done
  mean="–"
  if (( batch > 0 )); then
    mean=$(awk -v a="$spent" -v n="$batch" 'BEGIN { printf "%.2f", a / n }')
  fi
  echo "== $made snapshots" >&2
  size=$(du -sb "$WORK/repo" | awk '{ printf "%.1f", $1 / 1e6 }')
  row="| $made | $size"
  for cmd in snapshots stats check gc; do
    timed "$FERRY" "$cmd" --repo "$REPO" >"$WORK/measured"
    read -r s m <"$WORK/measured"
    row="$row | $s / $m"
  done
  timed "$FERRY" backup --repo "$REPO" --parent latest "$WORK/tree" >"$WORK/measured"
  read -r s m <"$WORK/measured"
  made=$((made + 1))
  row="$row | $s / $m | $mean |"
  echo "$row" >>"$REPORT"
done

{
  echo
  echo "(The no-change backup adds a snapshot: each row's count is before it.)"
  echo
  echo "## Concurrent writers"
  echo
  echo "K backups of K trees of $WRITER_FILES files each (seeds 101…), started at once into one new repository:"
  echo
  echo "| writers | all done (s) | each backup (s) | each peak RSS (MiB) |"
  echo "|---:|---:|---|---|"
} >>"$REPORT"

for k in ${WRITERS//,/ }; do
  echo "== $k writers" >&2
  for i in $(seq 1 "$k"); do
    [[ -d "$WORK/w$i" ]] || python3 "$HERE/helper.py" gen-tree --files "$WRITER_FILES" --seed $((100 + i)) "$WORK/w$i" >&2
  done
  rm -rf "$WORK/wrepo"
  WREPO="file://$WORK/wrepo"
  timed "$FERRY" repo init --repo "$WREPO" >/dev/null
  begin=$(date +%s.%N)
  pids=()
  for i in $(seq 1 "$k"); do
    /usr/bin/time -f '%e %M' -o "$WORK/wtime$i" "$FERRY" backup --repo "$WREPO" "$WORK/w$i" \
      >"$WORK/w$i.out" 2>"$WORK/w$i.err" &
    pids+=("$!")
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || { echo "growth.sh: writer $((i + 1)) failed:" >&2; cat "$WORK/w$((i + 1)).err" >&2; exit 1; }
  done
  pids=()
  end=$(date +%s.%N)
  times=""
  rss=""
  for i in $(seq 1 "$k"); do
    awk '{ printf "%.2f %d\n", $1, $2 / 1024 }' "$WORK/wtime$i" >"$WORK/measured"
    read -r s m <"$WORK/measured"
    times="$times${times:+, }$s"
    rss="$rss${rss:+, }$m"
  done
  all=$(awk -v a="$begin" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
  echo "| $k | $all | $times | $rss |" >>"$REPORT"
done

if [[ -n "$OUT" ]]; then
  cp "$REPORT" "$OUT"
  echo "== report in $OUT" >&2
fi
cat "$REPORT"
