#!/usr/bin/env bash
# Fails (listing the files) when a C++ file of the tree differs from what clang-format makes of
# it with the checked-in .clang-format. Run by the test suite (CTest "format"); fix with
#   clang-format -i $(git ls-files '*.cpp' '*.h')
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(find app src tests -path tests/export/node_modules -prune -o \( -name '*.cpp' -o -name '*.h' \) -print | sort)
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "check-format: ${#bad[@]} of ${#files[@]} files differ from .clang-format:" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "fix with: clang-format -i ${bad[*]}" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files follow .clang-format"
