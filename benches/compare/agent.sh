#!/usr/bin/env bash
# The node agent's targets on a real run: three `ferry agent` processes on simulated nodes
# (real control plane, loop devices, moto S3), release build.
#   - agent memory when idle (target < 50 MiB resident),
#   - DataUpload created -> Completed against a bare `ferry backup` of the same data into the
#     same S3 server (target <= 1.5x),
#   - progress on the CR after the upload starts (target <= 5 s).
# Usage: benches/compare/agent.sh [SIZE_MIB] [FILES]     (default 1024 MiB in 3000 files)
set -euo pipefail
cd "$(dirname "$0")/../.."
size="${1:-1024}"
files="${2:-3000}"
scripts/setup.sh
cargo build --locked --release -p ferry -p ferry-demo
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, load $(cut -d' ' -f1-3 /proc/loadavg)"
exec target/release/ferry-demo --ferry target/release/ferry --bench --size "$size" --files "$files"
