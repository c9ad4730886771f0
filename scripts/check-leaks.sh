#!/usr/bin/env bash
# Fails when the test suite left processes or temp dirs behind. Test binaries kill their
# services on exit; a janitor removes their temp dirs within a second or two after.
set -euo pipefail
for _ in $(seq 1 10); do
  procs="$(pgrep -a -x 'etcd|kube-apiserver|moto_server' || true)"
  dirs="$(find "${TMPDIR:-/tmp}" -maxdepth 1 -name 'ferry-testbed-*' 2>/dev/null || true)"
  [[ -z "$procs" && -z "$dirs" ]] && { echo "check-leaks: no leftover processes or temp dirs"; exit 0; }
  sleep 1
done
echo "check-leaks: the test suite left these behind:" >&2
[[ -n "$procs" ]] && echo "$procs" >&2
[[ -n "$dirs" ]] && echo "$dirs" >&2
exit 1
