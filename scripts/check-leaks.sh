#!/usr/bin/env bash
# Fails when the test suite left processes, temp dirs, loop devices, mounts or cgroups behind.
# Test binaries kill their services on exit; janitors remove their temp dirs, mounts, loop
# devices and the real node's cgroups within a few seconds after. The real node's mounts live in
# a mount namespace of its own (gone with its processes); one seen from the host is a leak.
set -euo pipefail
tmp="${TMPDIR:-/tmp}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/ferry"
for _ in $(seq 1 15); do
  # One name per pgrep: with -x, a pattern longer than 15 characters (a process name's limit)
  # matches nothing.
  procs="$(for name in etcd kube-apiserver moto_server minio velero velero-plugin-f; do pgrep -a -x "$name" || true; done
    # The real node's programs, by the folder they run from (a developer's own kubelet or
    # containerd is not the suite's).
    pgrep -a -f "$cache/realnode/bin/" || true)"
  dirs="$(find "$tmp" -maxdepth 1 \( -name 'ferry-testbed-*' -o -name 'ferry-sim-*' -o -name 'ferry-plugin-*' -o -name 'ferry-velero-*' -o -name 'ferry-realnode-*' \) 2>/dev/null || true)"
  # By folder name: a file on a mount that is gone (the node's, a tmpfs /tmp) is named
  # relative to that mount.
  loops="$(losetup -n -l -O NAME,BACK-FILE 2>/dev/null | grep -E "/ferry-(sim|realnode)-[^/]*/" || true)"
  mounts="$(awk '{print $5}' /proc/self/mountinfo | grep -E "$tmp/ferry-(sim|realnode)-|/var/lib/kubelet" || true)"
  janitors="$(pgrep -a -f 'ferry-sim-janitor|ferry-janitor' || true)"
  cgroups="$(ls -d /sys/fs/cgroup/*/ferry-testbed-* 2>/dev/null || true)"
  netns="$(ip link show ferry0 2>/dev/null || true)"
  if [[ -z "$procs$dirs$loops$mounts$janitors$cgroups$netns" ]]; then
    echo "check-leaks: no leftover processes, temp dirs, loop devices, mounts, cgroups or bridges"
    exit 0
  fi
  sleep 1
done
echo "check-leaks: the test suite left these behind:" >&2
for what in procs dirs loops mounts janitors cgroups netns; do
  [[ -n "${!what}" ]] && { echo "$what:"; echo "${!what}"; } >&2
done
exit 1
