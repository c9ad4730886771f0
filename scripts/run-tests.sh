#!/usr/bin/env bash
# Runs every test binary of the workspace, several at once: what `cargo test --workspace
# --all-targets --no-fail-fast` runs, but `cargo test` runs one binary after another, and the
# longest ones (the real node, the multi-node cluster, the real Velero server) mostly wait on
# real components. Each binary runs as cargo would run it (from its package's folder, with
# CARGO_MANIFEST_DIR and CARGO_PKG_NAME set); its output is printed whole when it ends, with
# its time. Every binary runs even after a failure; the exit status is 1 if any failed.
#
#   scripts/run-tests.sh [--jobs N]      (default: FERRY_TEST_JOBS, else 2)
#
# Two at a time on two cores: the longest binary (the real node) sets the pace, and every other
# binary fits beside it. Three at a time was faster still but loaded the machine enough to
# stretch real components' reaction times past what some tests allowed.
#
# The binaries are built first with the caller's environment (`make test` passes clippy's
# wrapper, so this build finds everything already built by `make test-build`).
set -uo pipefail
cd "$(dirname "$0")/.."

jobs="${FERRY_TEST_JOBS:-2}"
case "$#:${1:-}" in
  0:) ;;
  2:--jobs) jobs="$2" ;;
  *) echo "usage: scripts/run-tests.sh [--jobs N]" >&2; exit 2 ;;
esac
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "run-tests: --jobs takes a positive number, not '$jobs'" >&2; exit 2; }
command -v python3 >/dev/null || { echo "run-tests: python3 is needed to read cargo's build messages" >&2; exit 2; }

work="$(mktemp -d "${TMPDIR:-/tmp}/ferry-tests-XXXXXX")"
declare -a pids=()
# Each binary runs in a session of its own: stopped (Ctrl-C, a CI timeout) the script ends every
# running one with its whole process group, and their services follow (PR_SET_PDEATHSIG).
stop() {
  for pid in "${pids[@]}"; do
    [[ -n "$pid" ]] && kill -TERM -- "-$pid" 2>/dev/null
  done
  echo "run-tests: stopped; the running test binaries were ended" >&2
  exit 130
}
trap stop INT TERM
trap 'rm -rf "$work"' EXIT

# The test binaries, as cargo reports them: name, package folder, executable.
if ! ${CARGO:-cargo} test --workspace --locked --all-targets --no-run \
    --message-format=json-render-diagnostics >"$work/build.json"; then
  echo "run-tests: building the tests failed" >&2
  exit 1
fi
python3 - "$work/build.json" >"$work/binaries" <<'EOF'
import json, os, sys

# The longest first, so they start at once; the rest in cargo's order.
FIRST = ["realnode", "nodes", "velero_server", "e2e", "sim"]
# Benchmarks cargo builds as tests that measure only under `cargo bench` (minutes on the real
# node, tens of GiB of disk): not tests.
NOT_TESTS = [("ferry", "realnode_cbt")]
found = []
for line in open(sys.argv[1]):
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
        continue
    if not msg.get("profile", {}).get("test"):
        continue
    target = msg["target"]
    folder = os.path.dirname(msg["manifest_path"])
    # "path+file:///…/crates/ferry-repo#0.1.0" or "…#name@0.1.0"
    tail = msg["package_id"].rsplit("#", 1)[-1]
    package = tail.split("@")[0] if "@" in tail else os.path.basename(folder)
    kind = target["kind"][0]
    if kind == "bench" and (package, target["name"]) in NOT_TESTS:
        continue
    name = target["name"] if kind in ("test", "bench", "example") else f"{kind} {target['name']}"
    found.append((package, name, target["name"], folder, msg["executable"]))
rank = lambda b: FIRST.index(b[2]) if b[2] in FIRST else len(FIRST)
for package, name, _, folder, exe in sorted(found, key=rank):
    print(f"{package} {name}\t{folder}\t{exe}\t{package}")
EOF
total=$(wc -l <"$work/binaries")
[[ "$total" -gt 0 ]] || { echo "run-tests: cargo reported no test binaries" >&2; exit 1; }
echo "run-tests: $total test binaries, $jobs at a time"

# One binary: its output to a file, then printed whole with its status and time.
run_one() {
  local title="$1" folder="$2" exe="$3" package="$4" log="$5"
  local start=$SECONDS status=0
  (cd "$folder" && CARGO_MANIFEST_DIR="$folder" CARGO_PKG_NAME="$package" "$exe") >"$log" 2>&1 || status=$?
  # One block at a time on the terminal, even when two binaries end together.
  (
    flock 9
    echo "==== $title ($(basename "$exe")): exit $status after $((SECONDS - start)) s"
    cat "$log"
  ) 9>"$work/print.lock"
  echo "$status" >"$log.status"
}
export -f run_one
export work

# How many of the started binaries still run (a binary is done once its status is written, or
# once its session leader is gone).
running() {
  local n=0 i
  for i in "${!pids[@]}"; do
    if [[ -e "$work/$i.log.status" ]] || ! kill -0 "${pids[$i]}" 2>/dev/null; then
      pids[$i]=""
    elif [[ -n "${pids[$i]}" ]]; then
      n=$((n + 1))
    fi
  done
  echo "$n"
}

declare -a titles=()
failed=()
started=0
while IFS=$'\t' read -r title folder exe package; do
  # Bounded: never more than $jobs running; wait for one to end before starting the next.
  while [[ $(running) -ge $jobs ]]; do
    wait -n 2>/dev/null || sleep 1
  done
  titles[$started]="$title"
  setsid bash -c 'run_one "$@"' run-test "$title" "$folder" "$exe" "$package" "$work/$started.log" &
  pids[$started]=$!
  started=$((started + 1))
done <"$work/binaries"
wait

for i in "${!titles[@]}"; do
  status=$(cat "$work/$i.log.status" 2>/dev/null || echo "no status")
  [[ "$status" == 0 ]] && continue
  failed+=("${titles[$i]} (exit $status)")
  # The start of each failing test's message once more, at the end, where a reader of only
  # the last part of a long log still sees why it failed.
  echo "==== why ${titles[$i]} failed (the first lines of each failure; the whole log is above)" >&2
  why=$(awk '/^---- .* stdout ----$/ { n = 0; inside = 1 }
       /^(failures:|test result:)/ { inside = 0 }
       inside && n < 25 { print; n++ }' "$work/$i.log" 2>/dev/null || true)
  # No test's message (a crash, a kill, a binary without libtest's harness): the log's end.
  [[ -n "$why" ]] || why=$(tail -n 40 "$work/$i.log" 2>/dev/null || true)
  printf '%s\n' "$why" >&2
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "run-tests: ${#failed[@]} of $total test binaries failed:" >&2
  printf '  %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "run-tests: all $total test binaries passed"
