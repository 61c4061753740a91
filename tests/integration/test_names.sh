#!/usr/bin/env bash
# A ';' in a doctest case name splits it in CMake's test discovery: ctest then
# runs two entries that match no case and pass without running anything.
set -euo pipefail
root=$2
if grep -rn --include='*.cpp' -E 'TEST_CASE(_FIXTURE)?\(.*"[^"]*;[^"]*"' "$root/tests"; then
  echo "FAIL: the test names above contain ';' (ctest would run nothing for them)"
  exit 1
fi
echo ok
