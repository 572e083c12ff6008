#!/usr/bin/env bash
# A compile-fail check: SNIPPET must compile with -DGMLAKE_COMPILE_OK (so that its
# includes and setting are sound) and must fail without it, with a diagnostic that
# matches the snippet's "// expect: REGEX" line. Syntax only: nothing is linked.
#   bash tests/compile_fail/run.sh INCLUDE_DIR SNIPPET COMPILER [ARGS...]
set -uo pipefail
inc=${1:?usage: run.sh INCLUDE_DIR SNIPPET COMPILER [ARGS...]} src=${2:?} ; shift 2
expect=$(sed -n 's|^// expect: ||p' "$src" | head -n 1)
name=$(basename "$src" .cpp)
out=$(mktemp); trap 'rm -f "$out"' EXIT
compile() { "$@" -std=c++20 -fsyntax-only -I"$inc" "$src" >"$out" 2>&1; }

if ! compile "$@" -DGMLAKE_COMPILE_OK; then
  echo "$name: the valid variant does not compile:"; head -n 30 "$out"; echo "0 passed, 1 failed"; exit 1
fi
if compile "$@"; then
  echo "$name: compiles, but must not"; echo "0 passed, 1 failed"; exit 1
fi
if ! grep -qE -- "$expect" "$out"; then
  echo "$name: fails, but without a diagnostic matching '$expect':"; head -n 30 "$out"
  echo "0 passed, 1 failed"; exit 1
fi
echo "$name: does not compile, as required; first diagnostic:"
grep -m1 -E 'error' "$out"
echo "1 passed, 0 failed"
