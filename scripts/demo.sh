#!/usr/bin/env bash
# `make demo`: Ferry's main job end to end on one machine, with visible progress.
#
# Starts a real node on this machine (kube-apiserver, kubelet with containerd and runc, the CSI
# hostpath driver with its sidecars, scheduler and controllers, all inside namespaces of their
# own), an S3 server (moto), installs Ferry from its Helm chart as an image of the ferry binary,
# and runs the real `velero server` on the node. An application pod fills a PVC; `velero backup
# create --snapshot-move-data --data-mover ferry` backs it up (Ferry moves the data, with live
# progress), again after a change (incrementally); `velero restore create` restores it into
# another namespace, and the restored volume is compared file by file with the source; the
# repository is verified with the ferry CLI. Where the real node cannot start (it needs root
# and cgroup v1 or hybrid), the demo says why and runs on the node simulator instead
# (`--sim` asks for it). Everything is torn down at the end, also on failure or Ctrl-C.
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
