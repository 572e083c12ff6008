#!/usr/bin/env python3
"""Checks of bench/settings_sweep.py against gmlake-replay itself: the grid's
combinations, the rows it keeps, its per-trace table and its front.

    python3 tests/python/test_settings_sweep.py BUILD/bench/gmlake-replay   # ends with "N passed, N failed"
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

from runner import run_tests

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "settings_sweep.py")
TRACE = os.path.join(ROOT, "bench", "traces", "synthetic", "synth-offload.trace.gz")
REPLAY = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "bench", "gmlake-replay")

sys.path.insert(0, os.path.dirname(SCRIPT))  # settings_sweep imports run_benchmarks
spec = importlib.util.spec_from_file_location("settings_sweep", SCRIPT)
sweep = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sweep)

# Two combinations that differ where synth-offload's growth shows it (chunk sizes).
GRID = ["--grid", "max_chunk_mib=2,128", "--grid", "big_chunk_mib/big_growth_mib=256/768",
        "--grid", "stitch_edges_mib=4", "--grid", "min_growth_mib=0", "--grid", "small_growth_divisor=8"]


def run_sweep(*extra):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rows.jsonl")
        p = subprocess.run([sys.executable, SCRIPT, "--replay", REPLAY, "--jobs", "2", "--out", out] + GRID +
                           list(extra) + [TRACE], capture_output=True, text=True, check=True)
        with open(out) as f:
            return p.stdout, [json.loads(line) for line in f]


def replay_direct(settings):
    p = subprocess.run([REPLAY, "--json", "--config", "gmlake", "--settings", settings, TRACE],
                       capture_output=True, text=True, check=True)
    return json.loads(p.stdout.splitlines()[0])


def test_default_grid_size_and_pairs():
    combos = list(sweep.combinations(sweep.DEFAULT_GRID))
    assert len(combos) == 360, len(combos)
    assert len(set(combos)) == 360
    assert "max_chunk_mib:32,big_chunk_mib:256,big_growth_mib:768,stitch_edges_mib:4,min_growth_mib:16," \
           "small_growth_divisor:8" in combos  # the defaults are one of them
    for c in combos:  # a pair key sets both of its keys
        keys = [item.split(":")[0] for item in c.split(",")]
        assert keys.count("big_chunk_mib") == 1 and keys.count("big_growth_mib") == 1, c


def test_rows_equal_direct_replays():
    _, rows = run_sweep()
    assert len(rows) == 2, rows
    by = {r["settings"]: r for r in rows}
    assert set(by) == {f"max_chunk_mib:{m},big_chunk_mib:256,big_growth_mib:768,stitch_edges_mib:4,"
                       f"min_growth_mib:0,small_growth_divisor:8" for m in (2, 128)}, set(by)
    for s, r in by.items():
        d = replay_direct(s)
        for k in ("peak_reserved_bytes", "fragmentation", "backend_calls", "driver_us_per_iter_after_4"):
            assert r[k] == d[k], (s, k, r[k], d[k])
    a, b = (by[s] for s in sorted(by))  # 128 MiB chunks make fewer calls than 2 MiB ones
    assert a["backend_calls"] != b["backend_calls"]


def test_table_and_front():
    out, rows = run_sweep("--front", "--frag", "100", "--driver", "1e9")
    line = next(l for l in out.splitlines() if l.startswith("| synth-offload |"))
    assert line.endswith("| 2 of 2 |"), line  # both within bounds this loose
    best_drv = min(r["driver_us_per_iter_after_4"] for r in rows)
    assert f"| {best_drv:.0f} (" in line, (line, best_drv)
    front = out.split("synth-offload: fragmentation")[1].strip().splitlines()[1:]
    assert 1 <= len(front) <= 2, front
    # a front point is beaten by no row on both
    for f in front:
        frag, drv = float(f.split()[0].rstrip("%")), float(f.split()[1])
        assert not any(100 * r["fragmentation"] < frag - 1e-9 and r["driver_us_per_iter_after_4"] < drv - 0.5
                       for r in rows), f


def test_bounds_none():
    out, _ = run_sweep("--frag", "-1", "--driver", "-1")
    line = next(l for l in out.splitlines() if l.startswith("| synth-offload |"))
    assert line == "| synth-offload | none | none | 0 of 2 |", line


def test_bad_grid_refused():
    p = subprocess.run([sys.executable, SCRIPT, "--replay", REPLAY, "--grid", "max_chunk_mib", TRACE],
                       capture_output=True, text=True)
    assert p.returncode != 0 and "KEY=V1,V2" in p.stderr, p.stderr
    p = subprocess.run([sys.executable, SCRIPT, "--replay", REPLAY] + GRID + ["--grid", "bogus_key=1", TRACE],
                       capture_output=True, text=True)
    assert p.returncode != 0 and "bogus_key" in p.stderr, p.stderr  # the replay tool's refusal, passed on


def main():
    if not os.path.exists(REPLAY):
        print(f"SKIP: no {REPLAY}")
        return 77
    return run_tests(globals())


if __name__ == "__main__":
    sys.exit(main())
