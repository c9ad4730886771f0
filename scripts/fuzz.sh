#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ for a few seconds each (default 10; `scripts/fuzz.sh 300` for
# a longer session). `scripts/fuzz.sh --build-only` installs cargo-fuzz and builds the targets
# without running them (`make test` does that at low priority while the tests run). cargo-fuzz needs nightly-only compiler flags; RUSTC_BOOTSTRAP=1 lets the
# stable toolchain accept them, and `--sanitizer none` avoids needing a sanitizer runtime.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
# Its own build directory, even where CARGO_TARGET_DIR is shared: `make test` builds the fuzz
# targets while the tests run, and one build directory would make them wait for each other.
export CARGO_TARGET_DIR="$PWD/target"
seconds="${1:-10}"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked --version 0.13.2
export RUSTC_BOOTSTRAP=1
targets=$(cargo fuzz list)
cargo fuzz build --sanitizer none
if [[ $seconds == --build-only ]]; then
  echo "fuzz: built $(wc -w <<<"$targets") targets"
  exit 0
fi
for target in $targets; do
  mkdir -p "corpus/$target"
  echo "fuzz: $target for ${seconds}s"
  log="$(mktemp)"
  if ! cargo fuzz run --sanitizer none "$target" "corpus/$target" -- \
      -max_total_time="$seconds" -rss_limit_mb=2048 >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    rm -f "$log"
    echo "fuzz: $target found a crash (input saved under fuzz/artifacts/$target)" >&2
    exit 1
  fi
  grep -E '^#[0-9]+ +DONE' "$log" || tail -n 1 "$log"
  rm -f "$log"
done
echo "fuzz: all targets ran ${seconds}s without a crash"
