#!/usr/bin/env bash
# Fails when the test suite left processes, temp dirs, loop devices or mounts behind. Test
# binaries kill their services on exit; janitors remove their temp dirs, mounts and loop devices
# within a second or two after.
set -euo pipefail
tmp="${TMPDIR:-/tmp}"
for _ in $(seq 1 15); do
  # One name per pgrep: with -x, a pattern longer than 15 characters (a process name's limit)
  # matches nothing.
  procs="$(for name in etcd kube-apiserver moto_server minio velero velero-plugin-f; do pgrep -a -x "$name" || true; done)"
  dirs="$(find "$tmp" -maxdepth 1 \( -name 'ferry-testbed-*' -o -name 'ferry-sim-*' -o -name 'ferry-plugin-*' -o -name 'ferry-velero-*' \) 2>/dev/null || true)"
  loops="$(losetup -n -l -O NAME,BACK-FILE 2>/dev/null | grep -F "$tmp/ferry-sim-" || true)"
  mounts="$(awk '{print $5}' /proc/self/mountinfo | grep -F "$tmp/ferry-sim-" || true)"
  janitors="$(pgrep -a -f 'ferry-sim-janitor' || true)"
  if [[ -z "$procs$dirs$loops$mounts$janitors" ]]; then
    echo "check-leaks: no leftover processes, temp dirs, loop devices or mounts"
    exit 0
  fi
  sleep 1
done
echo "check-leaks: the test suite left these behind:" >&2
for what in procs dirs loops mounts janitors; do
  [[ -n "${!what}" ]] && { echo "$what:"; echo "${!what}"; } >&2
done
exit 1
