#!/usr/bin/env bash
# `make demo`: Ferry's main job end to end on one machine, with visible progress.
#
# Starts a real control plane (kube-apiserver + etcd with Velero's and the CSI snapshot CRDs),
# an S3 server (moto), three simulated nodes (kubelet, scheduler, CSI driver on real loop
# devices with ext4) and a `ferry agent` per node. An application's volume is backed up through
# a DataUpload exactly as Velero's CSI plugin creates it, changed and backed up again
# incrementally, then restored through a DataDownload into a new PVC and compared file by file
# with the source; the repository is verified with the ferry CLI. Everything is torn down at
# the end, also on failure or Ctrl-C.
#
# Options go to ferry-demo: `make demo DEMO_ARGS="--size 1024 --files 5000"`.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
scripts/setup.sh

say "Building Ferry and the demo"
cargo build --locked -p ferry -p ferry-demo

say "Running Ferry end to end"
# shellcheck disable=SC2086 # DEMO_ARGS is a list of options.
exec target/debug/ferry-demo --ferry target/debug/ferry ${DEMO_ARGS:-}
