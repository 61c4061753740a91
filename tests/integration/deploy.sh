#!/usr/bin/env bash
# The cluster deployment files, checked as far as this machine allows: the
# systemd unit template with systemd-analyze verify (ExecStart pointed at a
# binary that exists here), the Slurm batch script and the netns helper with
# the shellcheck linter. A missing checker skips that check with a message.
set -euo pipefail
root=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
checked=0
if command -v systemd-analyze >/dev/null; then
  sed "s|/usr/local/bin/rlsync|$1|" "$root/deploy/systemd/rlsync-node@.service" > "$dir/rlsync-node@.service"
  cp "$dir/rlsync-node@.service" "$dir/rlsync-node@head.service"
  out=$(systemd-analyze verify "$dir/rlsync-node@head.service" 2>&1 | grep -v "Failed to prepare filename\|Unit is bound\|network-online.target" || true)
  [ -z "$out" ] || { echo "FAIL: systemd-analyze verify: $out"; exit 1; }
  checked=$((checked + 1))
else
  echo "skipping the systemd check: systemd-analyze is not installed"
fi
if command -v shellcheck >/dev/null; then
  shellcheck "$root/deploy/slurm/rlsync.sbatch" "$root/deploy/netns.sh"
  checked=$((checked + 1))
else
  echo "skipping shellcheck: not installed"
fi
[ "$checked" -gt 0 ] || exit 77
echo ok
