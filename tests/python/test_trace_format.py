#!/usr/bin/env python3
"""Host-side checks of examples/torch (no torch, no GPU, no pytest needed):
the snapshot -> trace conversion and validation of capture_trace.py, and the
ctypes mirror of gmlake_torch_stats in gmlake_torch.py.

    python3 tests/python/test_trace_format.py        # ends with "N passed, N failed"
"""
import ctypes
import gzip
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples", "torch"))

import capture_trace as ct  # noqa: E402
import gmlake_torch as gt  # noqa: E402
from runner import run_tests  # noqa: E402

MiB = 1 << 20


def ev(action, addr, size=0, stream=0):
    return {"action": action, "addr": addr, "size": size, "stream": stream, "frames": []}


def synthetic_snapshot():
    """Two iterations of a toy job, as torch.cuda.memory._snapshot() shows them."""
    t = [
        ev("alloc", 0x1000, 999),                # 0: allocated before the capture started
        ev("segment_alloc", 0x7000000, 20 * MiB),  # 1: capture starts here (start=1)
        ev("alloc", 0x7000000, 4 * MiB),         # 2 weights, id 0
        ev("snapshot", 0, 0),                    # 3  (marker i 0 goes before index 4)
        ev("alloc", 0x7400000, 2 * MiB, 7),      # 4 activation on stream 7, id 1
        ev("free_requested", 0x1000, 999),       # 5 pre-capture alloc: requested ...
        ev("free_completed", 0x1000, 999),       # 6 ... and completed: unknown, skipped
        ev("free_requested", 0x7400000, 2 * MiB, 7),
        ev("free_completed", 0x7400000, 2 * MiB, 7),
        ev("snapshot", 0, 0),                    # 9  (marker i 1 before index 10)
        ev("alloc", 0x7400000, 3 * MiB),         # 10 same address again, new id 2
        ev("free_requested", 0x7400000, 3 * MiB),
        ev("segment_free", 0x7000000, 20 * MiB),
    ]
    return {"segments": [], "device_traces": [t]}


def test_convert_places_markers_and_ids():
    snap = synthetic_snapshot()
    lines, info = ct.snapshot_to_trace(snap, 0, markers=[(0, 4), (1, 10)], start=1)
    assert lines == [
        f"a 0 {4 * MiB} 0",
        "i 0",
        f"a 1 {2 * MiB} 7",
        "f 1",
        "i 1",
        f"a 2 {3 * MiB} 0",
    ], lines
    assert info["allocs"] == 3 and info["frees"] == 1 and info["iterations"] == 2, info
    assert info["unknown_frees"] == 1 and info["free_action"] == "free_completed", info
    assert info["live_at_end"] == 2, info


def test_free_requested_fallback():
    t = [ev("alloc", 16, 512), ev("free_requested", 16, 512), ev("alloc", 16, 1024)]
    lines, info = ct.convert_events(t)
    assert lines == ["a 0 512 0", "f 0", "a 1 1024 0"], lines
    assert info["free_action"] == "free_requested"


def test_realloc_of_live_address_stays_valid():
    t = [ev("alloc", 16, 512), ev("alloc", 16, 512), ev("free_completed", 16, 512)]
    lines, info = ct.convert_events(t, markers=[(5, 3)])
    assert lines == ["a 0 512 0", "f 0", "a 1 512 0", "f 1", "i 5"], lines
    assert info["anomalies"] == 1


def test_write_validate_roundtrip():
    snap = synthetic_snapshot()
    lines, _ = ct.snapshot_to_trace(snap, 0, markers=[(0, 4), (1, 10)], start=1)
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "toy.trace.gz")
        ct.write_trace(p, lines, {"workload": "toy", "source": "test", "gpu": "none",
                                  "torch_peak_allocated": 1, "torch_peak_reserved": 2})
        with gzip.open(p, "rt") as f:
            text = f.read()
        assert text.startswith("# workload toy\n# source test\n"), text[:80]
        r = ct.validate(p)
        assert r["ok"], r
        assert (r["allocs"], r["frees"], r["iterations"], r["live_at_end"]) == (3, 1, 2, 2), r
        assert r["peak_live_bytes"] == 7 * MiB, r
        assert r["streams"] == [0, 7] and r["meta"]["workload"] == "toy", r
        # a free of a dead id is caught
        ct.write_trace(p, lines + ["f 1"], {"workload": "bad"})
        r = ct.validate(p)
        assert not r["ok"] and "not live" in r["errors"][0], r


def test_shared_trace_if_present():
    p = os.path.join(ROOT, "bench", "traces", "opt1.3b-ckpt.trace.gz")
    if not os.path.exists(p):
        return
    r = ct.validate(p)
    assert r["ok"] and r["iterations"] == 8 and r["allocs"] == 32648, r


def test_stats_mirror_matches_header():
    # 1 + 16 int64 gauges + 5 counters + fit[5] + driver_calls[8] + limit + chunk
    assert ctypes.sizeof(gt.GmlakeTorchStats) == 37 * 8
    names = [f[0] for f in gt.GmlakeTorchStats._fields_]
    header = open(os.path.join(ROOT, "examples", "torch", "gmlake_torch.h")).read()
    body = header[header.index("typedef struct gmlake_torch_stats"):header.index("} gmlake_torch_stats;")]
    pos = [body.index(" " + n) for n in names]  # every field is in the header ...
    assert pos == sorted(pos), "field order differs from gmlake_torch.h"  # ... in this order
    d = gt.stats_to_dict(gt.GmlakeTorchStats())
    for k in ("reserved_bytes.all.peak", "allocated_bytes.all.peak", "num_ooms",
              "gmlake.fit.s5", "gmlake.driver_calls.set_access", "gmlake.chunk_bytes"):
        assert k in d, k
    assert list(d) == sorted(d)


def test_limit_plan():
    assert gt._limit_plan(40 << 30) == [(-1, 40 << 30)]
    assert gt._limit_plan(2.5e9) == [(-1, 2500000000)]
    for bad in (True, "1GB", -1):
        try:
            gt._limit_plan(bad)
        except (TypeError, ValueError):
            pass
        else:
            raise AssertionError(f"accepted {bad!r}")


def test_find_library():
    with tempfile.TemporaryDirectory() as d:
        lib = os.path.join(d, gt.LIB_NAME)
        open(lib, "w").close()
        saved = os.environ.pop("GMLAKE_TORCH_LIB", None)
        try:
            assert gt.find_library(lib) == os.path.realpath(lib)
            assert gt.find_library(d) == os.path.realpath(lib)  # a folder holding it
            os.environ["GMLAKE_TORCH_LIB"] = d
            assert gt.find_library() == os.path.realpath(lib)
            for given in ({"lib": os.path.join(d, "missing.so")}, {}):  # named but missing: an error
                if not given:
                    os.environ["GMLAKE_TORCH_LIB"] = os.path.join(d, "missing.so")
                try:
                    gt.find_library(**given)
                except RuntimeError as e:
                    assert "missing.so" in str(e) and "does not exist" in str(e), e
                else:
                    raise AssertionError(f"accepted {given or os.environ['GMLAKE_TORCH_LIB']}")
        finally:
            os.environ.pop("GMLAKE_TORCH_LIB", None)
            if saved is not None:
                os.environ["GMLAKE_TORCH_LIB"] = saved


def test_summarize_rounds():
    import json
    import summarize as sm
    tps = {"default": [100.0, 104.0, 96.0], "gmlake": [98.0, 100.0, 94.0], "expandable": [97.0, 99.0, 95.0]}
    with tempfile.TemporaryDirectory() as d:
        def put(name, **r):
            r.update(schema=sm.SCHEMA, kind="train", model="gpt2-dynseq", ok=True, losses=[1.0], losses_hex=["1"])
            with open(os.path.join(d, name + ".json"), "w") as f:
                json.dump(r, f)
        put("gpt2-dynseq.default", allocator="default", tag="", tokens_per_s=200.0)
        put("gpt2-dynseq.gmlake", allocator="gmlake", tag="", tokens_per_s=190.0)
        for a, xs in tps.items():
            for i, x in enumerate(xs, 1):
                put(f"gpt2-dynseq.{a}.round{i}", allocator=a, tag=f"round{i}", tokens_per_s=x)
        text = sm.summarize(d)
    # The main table holds the untagged runs only: 190 of 200.
    assert "| gmlake | yes |" in text and "| 190 | 95.0% |" in text, text
    assert "## Throughput rounds" in text and "3 rounds" in text
    # gmlake per round: 98.0%, 96.2%, 97.9%: median 97.9%.
    assert "| 98 (98.0%) | 100 (96.2%) | 94 (97.9%) | 97.9% | 96.2% | 98.0% |" in text, text
    assert "gmlake median 97.92% of default over 3 rounds (min 96.15%, max 98.00%)" in text, text
    assert "| cudamallocasync | - | - | - | - | - | - |" in text


def main():
    return run_tests(globals())


if __name__ == "__main__":
    sys.exit(main())
