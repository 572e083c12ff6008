# Helpers sourced by .ci/main, .ci/test and .ci/run; not a script of its own.
# Logs go into each build folder: DIR/ci-setup.log, ci-build.log, ci-test.log.

ci_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# The CUDA toolkit, where installed, builds the GPU tests (they skip without a GPU).
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH=$PATH:/usr/local/cuda/bin
fi

# ci_configure DIR [meson options...]: configures DIR, or reconfigures it with
# the given options when it is configured already (wiping it if that fails).
ci_configure() {
  local dir=$ci_root/$1; shift
  local log rc=0
  rm -f "$dir/meson-logs/ci-totals"  # no stale counts if this phase fails early
  log=$(mktemp)
  if [[ -f $dir/meson-private/coredata.dat ]]; then
    meson setup --reconfigure "$dir" "$ci_root" "$@" >"$log" 2>&1 ||
      meson setup --wipe "$dir" "$ci_root" "$@" >"$log" 2>&1 || rc=$?
  else
    meson setup "$dir" "$ci_root" "$@" >"$log" 2>&1 || rc=$?
  fi
  if [[ $rc -ne 0 ]]; then
    echo "[ci] meson setup ${dir#"$ci_root"/} failed:" >&2; tail -n 40 "$log" >&2; rm -f "$log"
    return 1
  fi
  mv "$log" "$dir/ci-setup.log"
}

# ci_doctest_totals DIR LABEL: reads DIR/meson-logs/testlog.json (one JSON
# object per test run: name, result, stdout), prints one line per test with
# doctest's "[doctest] test cases: N | P passed | F failed" counts and writes
# "P F" summed over the tests to DIR/meson-logs/ci-totals. A test that did not
# pass although its doctest summary shows no failed case (crash, sanitizer
# report at exit, timeout: no summary at all) counts as one failed test case,
# and so does a run that left no results, so no failure can hide.
ci_doctest_totals() {
  local dir=$ci_root/$1 label=$2 py
  py=$(command -v /usr/bin/python3 || command -v python3 || echo python3)
  if ! "$py" - "$dir/meson-logs/testlog.json" "$dir/meson-logs/ci-totals" "$label" <<'PY'
import json, re, sys
path, totals, label = sys.argv[1:4]
summary = re.compile(r"\[doctest\] test cases:\s*(\d+)\s*\|\s*(\d+)\s*passed\s*\|\s*(\d+)\s*failed")
plain = re.compile(r"^()(\d+) passed, (\d+) failed\s*$", re.M)  # tests written in Python
ansi = re.compile(r"\x1b\[[0-9;]*m")
passed = failed = 0
try:
    runs = [json.loads(line) for line in open(path) if line.strip()]
except OSError:
    runs = []
for run in runs:
    out = ansi.sub("", (run.get("stdout") or "") + (run.get("stderr") or ""))
    found = summary.findall(out) or plain.findall(out)
    p, f = (int(found[-1][1]), int(found[-1][2])) if found else (0, 0)
    result = run.get("result", "?")
    note = ""
    if result not in ("OK", "SKIP", "EXPECTEDFAIL") and f == 0:
        f, note = 1, f"  <- rc {run.get('returncode')} with no failed doctest case: counted as 1 failed"
    elif not found and result != "SKIP":
        note = "  (no doctest summary)"
    name = run.get("name", "?").split(" / ")[-1]
    print(f"[ci] {label:<5} {name:<7} {result:<8} test cases {p} passed | {f} failed{note}")
    passed += p
    failed += f
if not runs:
    print(f"[ci] {label:<5} no test results in {path}: counted as 1 failed")
    failed += 1
with open(totals, "w") as out:
    print(passed, failed, file=out)
PY
  then
    echo "0 1" >"$dir/meson-logs/ci-totals"
  fi
}

# ci_meson_test DIR LABEL [TARGET...] -- [meson test arguments...]: builds the
# ninja TARGETs (paths such as tests/gmlake-stress; none: everything), runs
# `meson test` with the arguments, prints the per-test doctest counts and, on
# failure, the tail of the log. Leaves "PASSED FAILED" in
# DIR/meson-logs/ci-totals; returns non-zero when the build or a test failed.
ci_meson_test() {
  local dir=$1 label=$2; shift 2
  local targets=()
  while [[ $# -gt 0 && $1 != -- ]]; do targets+=("$1"); shift; done
  [[ ${1-} == -- ]] && shift
  local bdir=$ci_root/$dir
  local blog=$bdir/ci-build.log tlog=$bdir/ci-test.log rc=0
  mkdir -p "$bdir/meson-logs"
  rm -f "$bdir/meson-logs/testlog.json" "$bdir/meson-logs/ci-totals"
  if ! ninja -C "$bdir" "${targets[@]}" >"$blog" 2>&1; then
    echo "[ci] $label: build failed; full log: ${blog#"$ci_root"/}" >&2
    grep -E -A6 'error:|FAILED:' "$blog" | head -n 40 >&2 || tail -n 30 "$blog" >&2
    echo "0 1" >"$bdir/meson-logs/ci-totals"
    return 1
  fi
  meson test -C "$bdir" --no-rebuild --print-errorlogs "$@" >"$tlog" 2>&1 || rc=$?
  ci_doctest_totals "$dir" "$label"
  [[ $rc -eq 0 ]] || ci_show_failure "$tlog" "$label: meson test failed (rc $rc)"
  return $rc
}

# ci_show_failure LOG TITLE: prints the first failure in LOG (doctest's failed
# test case or a sanitizer report) with some context, then the log's tail.
ci_show_failure() {
  local log=$1 first
  echo "[ci] $2; full log: ${log#"$ci_root"/}" >&2
  first=$(grep -n -m1 -E 'TEST CASE:|(ERROR|WARNING): [A-Za-z]+Sanitizer|runtime error:' "$log" | cut -d: -f1)
  if [[ -n $first ]]; then
    sed -n "$((first > 3 ? first - 3 : 1)),$((first + 30))p" "$log" >&2
    tail -n "+$((first + 31))" "$log" | tail -n 12 >&2
  else
    tail -n 12 "$log" >&2
  fi
}
