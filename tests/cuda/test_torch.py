#!/usr/bin/env python3
"""gmlake as PyTorch's own CUDA allocator, checked against PyTorch's native one.

    python3 tests/cuda/test_torch.py [OUT_DIR]

Runs the same checks twice, each in a fresh process (an allocator is chosen once per
process): with PyTorch's native caching allocator, then with gmlake installed by
gmlake_torch.enable() (the _gmlake_torch extension must be importable: pip install
--no-build-isolation ./examples/torch). Prints one line per check and allocator and
exits 0 when every check passed under gmlake and gave the same result as under the
native allocator, 1 otherwise, 77 (skip) without torch, a GPU or the extension. OUT_DIR receives
the memory snapshot (pickle, for https://pytorch.org/memory_viz) and the layout picture.

The checks: torch.cuda memory statistics calls (reset_accumulated_memory_stats included); empty_cache;
set_per_process_memory_fraction with the out-of-memory error (a fraction below one chunk
included, and a memory pool counted with the device) and the out-of-memory observers; record_stream; CUDA
graphs under torch.cuda.graph (intermediates freed in the capture, tensors made after
it untouched by replay), with two graphs sharing a pool, make_graphed_callables and
torch.compile(mode="reduce-overhead"); memory history and snapshots (skip_actions included); and, in a third
process, gmlake's settings (enable(conf=...): refused when not valid, applied, fixed once
CUDA is initialised).
"""
import json
import os
import subprocess
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "examples", "torch"))

MiB = 1 << 20


def checks(allocator, out_dir):
    import torch

    if allocator == "gmlake":
        import gmlake_torch
        assert gmlake_torch.enable(native=True) == "native"
    results = {}

    def check(name):
        def wrap(fn):
            try:
                value = fn()
                results[name] = {"ok": True, "value": value}
            except Exception as e:  # a failed check is a result, not a crash
                results[name] = {"ok": False, "error": f"{type(e).__name__}: {e}",
                                 "trace": traceback.format_exc(limit=4)}
            return fn
        return wrap

    dev = torch.device("cuda", 0)
    torch.cuda.init()

    @check("stats")
    def _():
        base = torch.cuda.memory_allocated()
        x = torch.empty(10 * MiB, dtype=torch.uint8, device=dev)
        grown = torch.cuda.memory_allocated() - base
        assert grown >= 10 * MiB, grown
        assert torch.cuda.memory_reserved() >= torch.cuda.memory_allocated()
        assert torch.cuda.max_memory_allocated() >= torch.cuda.memory_allocated()
        s = torch.cuda.memory_stats()
        for k in ("allocated_bytes.all.current", "allocated_bytes.small_pool.current",
                  "allocated_bytes.large_pool.current", "reserved_bytes.all.peak",
                  "reserved_bytes.large_pool.current", "segment.all.current", "num_ooms",
                  "requested_bytes.all.current", "active_bytes.all.peak", "allocation.all.allocated"):
            assert k in s, k
        assert s["allocated_bytes.large_pool.current"] >= 10 * MiB
        small = torch.empty(1000, dtype=torch.uint8, device=dev)
        assert torch.cuda.memory_stats()["allocation.small_pool.current"] >= 1
        del x, small
        torch.cuda.reset_peak_memory_stats()
        assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()
        summary = torch.cuda.memory_summary()
        assert "Allocated memory" in summary
        return {"keys": sorted(k for k in s if not k.startswith("gmlake.")), "grown_ok": True}

    @check("empty_cache")
    def _():
        xs = [torch.empty(64 * MiB, dtype=torch.uint8, device=dev) for _ in range(4)]
        del xs
        before = torch.cuda.memory_reserved()
        torch.cuda.empty_cache()
        after = torch.cuda.memory_reserved()
        assert after < before, (before, after)
        return {"released": True}

    @check("memory_fraction_oom")
    def _():
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(0.05, 0)
        try:
            ooms = torch.cuda.memory_stats().get("num_ooms", 0)
            try:
                torch.empty(int(total * 0.10), dtype=torch.uint8, device=dev)
                raise AssertionError("no OutOfMemoryError above the fraction")
            except torch.cuda.OutOfMemoryError as e:
                msg = str(e)
            assert "Tried to allocate" in msg, msg
            assert torch.cuda.memory_stats()["num_ooms"] == ooms + 1
            y = torch.ones(int(total * 0.02) // 4, device=dev)  # within the cap: fine
            assert float(y[-1]) == 1.0
            del y
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0, 0)
        return {"oom_raised": True, "message": msg[:400]}

    @check("memory_fraction_rounding_to_nothing")
    def _():
        # a fraction too small for one chunk allows nothing (it is not "no cap")
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(1e-7, 0)
        try:
            torch.empty(64 * MiB, dtype=torch.uint8, device=dev)
            raise AssertionError("no OutOfMemoryError under a fraction of 1e-7")
        except torch.cuda.OutOfMemoryError:
            pass
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0, 0)
        return {"oom_raised": True}

    @check("memory_fraction_with_pool")
    def _():
        if not (hasattr(torch.cuda, "MemPool") and hasattr(torch.cuda, "use_mem_pool")):
            return {"skipped": "this PyTorch has no torch.cuda.MemPool"}
        # the fraction caps the device's memory and its pools' together
        total = torch.cuda.get_device_properties(0).total_memory
        n = int(total * 0.03) // (2 * MiB) * (2 * MiB)
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(0.05, 0)
        try:
            a = torch.empty(n, dtype=torch.uint8, device=dev)
            pool = torch.cuda.MemPool()
            with torch.cuda.use_mem_pool(pool):
                try:
                    b = torch.empty(n, dtype=torch.uint8, device=dev)
                    del b
                    raise AssertionError("the pool's memory is not counted with the device's under the fraction")
                except torch.cuda.OutOfMemoryError:
                    pass
            torch.cuda.set_per_process_memory_fraction(1.0, 0)
            with torch.cuda.use_mem_pool(pool):  # no cap again: the pool's limit is lifted too
                b = torch.empty(int(total * 0.10), dtype=torch.uint8, device=dev)
                del b
            del a, pool
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0, 0)
        return {"oom_raised": True}

    @check("oom_observer")
    def _():
        attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is None:
            return {"skipped": "this PyTorch has no out-of-memory observers"}
        seen = []
        attach(lambda device, alloc, shown_total, free: seen.append((device, alloc, shown_total, free)))
        total = torch.cuda.get_device_properties(0).total_memory
        n = int(total * 0.10) // (2 * MiB) * (2 * MiB)
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(0.05, 0)
        try:
            torch.empty(n, dtype=torch.uint8, device=dev)
            raise AssertionError("no OutOfMemoryError above the fraction")
        except torch.cuda.OutOfMemoryError:
            pass
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0, 0)
        assert len(seen) == 1, seen
        device, alloc, shown_total, free = seen[0]
        assert device == 0 and alloc == n, ("the observer's size is not the request", alloc, n)
        assert abs(shown_total - 0.05 * total) <= 4 * MiB, ("the observer's total is not the fraction's", shown_total)
        return {"size_is_request": True, "total_is_fraction": True}

    @check("reset_accumulated")
    def _():
        torch.cuda.empty_cache()
        x = torch.empty(96 * MiB, dtype=torch.uint8, device=dev)
        del x
        torch.cuda.empty_cache()
        torch.cuda.reset_accumulated_memory_stats()
        s = torch.cuda.memory_stats()
        keys = ("num_device_alloc", "num_device_free", "reserved_bytes.all.allocated", "reserved_bytes.all.freed",
                "segment.all.allocated", "segment.all.freed", "allocation.all.allocated", "allocated_bytes.all.freed",
                "num_alloc_retries", "num_sync_all_streams", "num_ooms")
        left = {k: s[k] for k in keys if s.get(k, 0) != 0}
        assert not left, ("not zero after reset_accumulated_memory_stats", left)
        y = torch.empty(160 * MiB, dtype=torch.uint8, device=dev)
        s = torch.cuda.memory_stats()
        assert s["reserved_bytes.all.allocated"] >= 160 * MiB, s["reserved_bytes.all.allocated"]
        assert s.get("num_device_alloc", 1) >= 1
        del y
        return {"zeroed": sorted(keys)}

    @check("record_stream")
    def _():
        n = 16 * MiB // 4
        side = torch.cuda.Stream()
        x = torch.zeros(n, device=dev)
        torch.cuda.synchronize()
        old = x.data_ptr()
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)  # keeps the side stream busy (~0.1 s)
            x.fill_(1.0)                    # runs after the sleep
        x.record_stream(side)
        del x
        y = torch.full((n,), 2.0, device=dev)  # on the default stream, at once
        reused = y.data_ptr() == old
        torch.cuda.synchronize()
        intact = bool((y == 2.0).all())
        assert intact, "a block freed with record_stream was reused before the side stream finished"
        return {"intact": intact, "reused_while_pending": reused}

    def close(a, b):
        return torch.allclose(a, b, rtol=1e-4, atol=1e-3)

    def f(x, w1, w2):
        a = x @ w1
        b = torch.relu(a)
        del a
        return b @ w2

    def warm_up(*args):
        """Runs f on a side stream first, as torch.cuda.graph's documentation asks."""
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                f(*args)
        torch.cuda.current_stream().wait_stream(s)

    @check("graph")
    def _():
        torch.manual_seed(0)
        x = torch.randn(512, 1024, device=dev)
        w1 = torch.randn(1024, 4096, device=dev)
        w2 = torch.randn(4096, 256, device=dev)
        warm_up(x, w1, w2)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = f(x, w1, w2)
        # tensors of the intermediates' size, made after the capture
        fillers = [torch.full((512, 4096), 7.0, device=dev) for _ in range(4)]
        x.copy_(torch.randn(512, 1024, device=dev))
        g.replay()
        torch.cuda.synchronize()
        expect = f(x, w1, w2)
        assert close(out, expect), "replay differs from eager"
        assert all(bool((t == 7.0).all()) for t in fillers), "replay wrote into tensors made after capture"
        del g, out, fillers
        return {"replay_equal": True, "fillers_intact": True}

    @check("graph_shared_pool")
    def _():
        torch.manual_seed(1)
        x = torch.randn(256, 1024, device=dev)
        w1 = torch.randn(1024, 2048, device=dev)
        w2 = torch.randn(2048, 512, device=dev)
        w4 = torch.randn(512, 1024, device=dev)
        warm_up(x, w1, w2)
        pool = torch.cuda.graph_pool_handle()
        g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(g1, pool=pool):
            out1 = f(x, w1, w2)
        with torch.cuda.graph(g2, pool=pool):
            out2 = f(out1 @ w4, w1, w2)
        fillers = [torch.full((256, 2048), 5.0, device=dev) for _ in range(4)]
        x.copy_(torch.randn(256, 1024, device=dev))
        g1.replay()
        g2.replay()
        torch.cuda.synchronize()
        e1 = f(x, w1, w2)
        e2 = f(e1 @ w4, w1, w2)
        assert close(out1, e1) and close(out2, e2), "shared-pool replays differ from eager"
        assert all(bool((t == 5.0).all()) for t in fillers), "replay wrote into tensors made after capture"
        reserved_with_graphs = torch.cuda.memory_reserved()
        before = torch.cuda.memory_stats()
        del g1, g2, out1, out2
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        released = torch.cuda.memory_reserved() < reserved_with_graphs
        assert released, "the pool's memory was not released after its graphs were destroyed"
        after = torch.cuda.memory_stats()
        # the pool's release is counted, and no peak or total goes down with it
        assert after["reserved_bytes.all.freed"] > before["reserved_bytes.all.freed"], "the release is not counted"
        for k in ("reserved_bytes.all.peak", "reserved_bytes.all.allocated", "segment.all.allocated",
                  "num_device_alloc"):
            assert after.get(k, 0) >= before.get(k, 0), (k, before.get(k), after.get(k))
        return {"replay_equal": True, "fillers_intact": True, "pool_released": released, "counted": True}

    @check("make_graphed_callables")
    def _():
        torch.manual_seed(2)
        model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).to(dev)
        eager = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).to(dev)
        eager.load_state_dict(model.state_dict())
        sample = torch.randn(64, 512, device=dev, requires_grad=True)
        graphed = torch.cuda.make_graphed_callables(model, (sample,))
        ok = True
        for step in range(3):
            inp = torch.randn(64, 512, device=dev, requires_grad=True)
            inp2 = inp.detach().clone().requires_grad_(True)
            filler = torch.full((64, 1024), 3.0, device=dev)
            y = graphed(inp)
            y.sum().backward()
            ye = eager(inp2)
            ye.sum().backward()
            torch.cuda.synchronize()
            ok &= torch.allclose(y, ye, rtol=1e-4, atol=1e-4) and torch.allclose(inp.grad, inp2.grad, rtol=1e-4, atol=1e-4)
            ok &= bool((filler == 3.0).all())
        assert ok, "graphed callable differs from eager"
        return {"equal": bool(ok)}

    @check("compile_reduce_overhead")
    def _():
        torch.manual_seed(3)
        x = torch.randn(512, 1024, device=dev)
        w1 = torch.randn(1024, 4096, device=dev)
        w2 = torch.randn(4096, 256, device=dev)
        cf = torch.compile(f, mode="reduce-overhead")
        outs_ok = True
        fillers = []
        for i in range(5):
            xi = torch.randn(512, 1024, device=dev)
            y = cf(xi, w1, w2).clone()
            fillers.append(torch.full((512, 4096), float(i), device=dev))
            outs_ok &= torch.allclose(y, f(xi, w1, w2), rtol=1e-3, atol=1e-2)
        torch.cuda.synchronize()
        intact = all(bool((t == float(i)).all()) for i, t in enumerate(fillers))
        assert outs_ok, "compiled (reduce-overhead) output differs from eager"
        assert intact, "a replay wrote into tensors made after capture"
        return {"equal": bool(outs_ok), "fillers_intact": intact}

    @check("snapshot")
    def _():
        torch.cuda.memory._record_memory_history(max_entries=10000)
        keep = [torch.empty(n * MiB, dtype=torch.uint8, device=dev) for n in (1, 3, 40, 90)]
        tmp = torch.empty(2 * MiB, dtype=torch.uint8, device=dev)
        del tmp
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        segs = snap["segments"]
        assert segs, "no segments"
        sizes = {b["size"] for s in segs for b in s["blocks"] if b["state"] == "active_allocated"}
        assert 40 * MiB in sizes and 90 * MiB in sizes, sorted(sizes)[:20]
        for s in segs:
            assert sum(b["size"] for b in s["blocks"]) == s["total_size"], "blocks do not tile their segment"
        actions = {e["action"] for t in snap["device_traces"] for e in t}
        assert {"alloc", "free_requested"} <= actions, actions
        frames = any(e.get("frames") for t in snap["device_traces"] for e in t if e["action"] == "alloc")
        import pickle
        with open(os.path.join(out_dir, f"snapshot-{allocator}.pickle"), "wb") as fh:
            pickle.dump(snap, fh)
        if allocator == "gmlake":
            import gmlake_torch
            gmlake_torch.plot_layout(os.path.join(out_dir, "gmlake-layout.png"), snapshot=snap)
        del keep
        return {"segments": len(segs), "actions": sorted(actions), "frames": bool(frames)}

    @check("history_skip_actions")
    def _():
        import inspect
        if "skip_actions" not in inspect.signature(torch.cuda.memory._record_memory_history).parameters:
            return {"skipped": "this PyTorch's _record_memory_history has no skip_actions"}
        torch.cuda.memory._record_memory_history(max_entries=1000, skip_actions=["free_requested", "free_completed"])
        x = torch.empty(8 * MiB, dtype=torch.uint8, device=dev)
        del x
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        actions = {e["action"] for t in snap["device_traces"] for e in t}
        assert "alloc" in actions and not actions & {"free_requested", "free_completed"}, actions
        try:
            torch.cuda.memory._record_memory_history(max_entries=10, skip_actions=["no_such_action"])
            refused = False
        except Exception:
            refused = True
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        assert refused or allocator != "gmlake", "an unknown action name was accepted"
        return {"actions": sorted(actions & {"alloc", "free_requested", "free_completed"}), "unknown_refused": refused}

    if allocator == "gmlake":
        import gmlake_torch
        extra = {k: v for k, v in gmlake_torch.memory_stats().items() if k.startswith("gmlake.")}
        results["gmlake_extra_keys"] = {"ok": len(extra) > 10, "value": sorted(extra)[:8]}
    return results


def settings_checks():
    """gmlake_torch.enable(conf=...): a bad conf is refused before anything is
    installed, a good one sets the chunk sizes, and settings are fixed once in use."""
    import torch
    import gmlake_torch
    results = {}
    try:
        gmlake_torch.enable(native=True, conf="max_chunk_mib:64,bogus:1")
        results["settings_refused"] = {"ok": False, "error": "no error for an unknown key"}
    except ValueError as e:
        ok = "'bogus:1'" in str(e) and not gmlake_torch.is_enabled() and not torch.cuda.is_initialized()
        results["settings_refused"] = ({"ok": True, "value": str(e)[:120]} if ok else
                                       {"ok": False, "error": f"enabled or CUDA initialised after: {e}"})
    try:
        assert gmlake_torch.enable(native=True, conf="max_chunk_mib:64, stitch_edges_mib:0") == "native"
        assert gmlake_torch.settings() == "max_chunk_mib:64,stitch_edges_mib:0", gmlake_torch.settings()
        before = gmlake_torch.memory_stats()["gmlake.driver_calls.create"]
        x = torch.empty(200 * MiB, dtype=torch.uint8, device="cuda")
        made = gmlake_torch.memory_stats()["gmlake.driver_calls.create"] - before
        assert made == 4, f"{made} chunks for 200 MiB (3 x 64 MiB + 8 MiB expected)"
        try:
            gmlake_torch.enable(conf="max_chunk_mib:128")
            raise AssertionError("settings changed after CUDA was initialised")
        except RuntimeError as e:
            late = str(e)[:120]
        gmlake_torch.enable()  # again, no conf: harmless
        del x
        results["settings_applied"] = {"ok": True, "value": {"chunks_for_200_MiB": made, "late": late}}
    except Exception as e:
        results["settings_applied"] = {"ok": False, "error": f"{type(e).__name__}: {e}",
                                       "trace": traceback.format_exc(limit=4)}
    return results


def child(allocator, out_dir, result_path):
    res = settings_checks() if allocator == "gmlake-settings" else checks(allocator, out_dir)
    with open(result_path, "w") as fh:
        json.dump(res, fh, indent=1, default=str)


def main():
    try:
        import torch
    except ImportError:
        print("SKIP: no torch")
        return 77
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 77
    try:
        import _gmlake_torch  # noqa: F401
    except ImportError:
        print("SKIP: the extension _gmlake_torch is not installed "
              "(pip install --no-build-isolation ./examples/torch)")
        return 77
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "torch-test")
    os.makedirs(out_dir, exist_ok=True)
    runs = {}
    for allocator in ("native", "gmlake", "gmlake-settings"):
        path = os.path.join(out_dir, f"checks-{allocator}.json")
        r = subprocess.run([sys.executable, __file__, "--child", allocator, out_dir, path])
        if r.returncode != 0 or not os.path.exists(path):
            print(f"FAIL {allocator}: the check process ended with {r.returncode}")
            runs[allocator] = {}
            continue
        with open(path) as fh:
            runs[allocator] = json.load(fh)
    failed = 0
    gmlake_runs = {**runs.get("gmlake", {}), **runs.get("gmlake-settings", {})}
    names = list(dict.fromkeys(list(runs.get("native", {})) + list(gmlake_runs)))
    if not runs.get("gmlake-settings"):
        names.append("settings_applied")  # its process failed: counted as a failure
    for name in names:
        n, g = runs.get("native", {}).get(name), gmlake_runs.get(name)
        ok = g is not None and g["ok"]
        if name == "stats" and ok and n and n["ok"]:
            missing = set(n["value"]["keys"]) - set(g["value"]["keys"])
            if missing:
                ok = False
                g = {**g, "error": f"keys missing under gmlake: {sorted(missing)[:10]}"}
        native = "-" if n is None else ("pass" if n["ok"] else "fail: " + n.get("error", ""))
        line = f"{'PASS' if ok else 'FAIL'} {name}: gmlake {'pass' if g and g['ok'] else 'fail'}; native {native}"
        if g and not ok:
            line += "\n    " + g.get("error", "") + "\n    " + g.get("trace", "").replace("\n", "\n    ")
        elif g and g["ok"]:
            line += f"\n    {json.dumps(g['value'])[:300]}"
        print(line)
        failed += not ok
    print(f"{len(names) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(main())
