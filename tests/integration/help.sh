#!/usr/bin/env bash
# rlsync --help lists the subcommands; an unknown subcommand fails with exit 2.
set -euo pipefail
rlsync=$1
out=$("$rlsync" --help)
for cmd in version devices ping; do
  grep -q "^  $cmd " <<<"$out" || { echo "missing subcommand '$cmd' in --help"; exit 1; }
done
set +e
"$rlsync" no-such-command 2>/tmp/rlsync-help-$$.err
rc=$?
set -e
[ "$rc" -eq 2 ] || { echo "unknown subcommand: expected exit 2, got $rc"; exit 1; }
grep -q "unknown subcommand 'no-such-command'" /tmp/rlsync-help-$$.err
rm -f /tmp/rlsync-help-$$.err
echo "ok"
