#!/usr/bin/env python3
"""capture_trace - record a PyTorch job's CUDA allocations as a gmlake trace.

The trace format (gzip text, one event per line, in program order) is the one
build/bench/gmlake-replay reads:

    # key value          metadata (workload, source, gpu, torch_peak_allocated, ...)
    a ID BYTES STREAM    allocate BYTES (as requested by PyTorch) on STREAM
    f ID                 free the allocation named ID
    i N                  iteration N starts (a boundary marker)

From Python:

    from capture_trace import TraceRecorder
    with TraceRecorder("my.trace.gz", workload="my-job") as rec:
        for step in range(n):
            rec.iteration(step)
            train_step()

From the shell (the script may call capture_trace.mark_iteration() each step):

    python3 capture_trace.py --out my.trace.gz [--workload NAME] -- script.py args...
    python3 capture_trace.py --validate my.trace.gz
    python3 capture_trace.py --convert snapshot.pickle --out my.trace.gz

How it records: torch.cuda.memory._record_memory_history(enabled="all",
context=None) keeps every allocator event of PyTorch's caching allocator (no
stack traces, so it is cheap); at the end one _snapshot() gives the event list
(device_traces[device]). 'alloc' events become `a`, 'free_completed' events
(when the block is really reusable; 'free_requested' only if a trace has no
'free_completed' at all) become `f`; addresses map to ids; segment_* and other
actions are ignored.

Where the `i N` markers go: iteration(n) takes a _snapshot() and notes how many
events the device trace holds at that moment (L). Every event with index < L
happened before the marker and every later one after it, in the allocator's own
order, so the marker lands exactly in program order; no clock is compared. The
history is a ring buffer only when it exceeds max_entries (default: no limit),
and that case is detected and reported. Each marker costs one snapshot (it
copies the event list to Python), so markers are for iteration boundaries, not
for every op. Only PyTorch's native caching allocator records history: not
cudaMallocAsync, not a pluggable allocator (gmlake).

Pure parts (convert_events, write_trace, validate, read_trace) need no torch.
"""

import gzip
import os
import sys

__all__ = [
    "TraceRecorder",
    "mark_iteration",
    "convert_events",
    "write_trace",
    "read_trace",
    "validate",
    "snapshot_to_trace",
]

_active = None  # the recorder mark_iteration() talks to


def convert_events(entries, markers=(), start=0):
    """Converts allocator trace entries (dicts with 'action', 'addr', 'size',
    'stream') to trace lines.

    entries: device_traces[device] of a torch.cuda.memory._snapshot().
    markers: (n, index) pairs: `i n` goes before entries[index] (index may be
             len(entries): after the last event).
    start: entries before this index are ignored (recorded before the capture).
    Returns (lines, info): lines without trailing newlines; info counts allocs,
    frees, iterations, frees of unknown addresses (allocated before recording),
    anomalies (an address allocated again while live: its old id is freed
    first, so the trace stays valid) and the events' actions."""
    free_action = "free_completed"
    if not any(e.get("action") == "free_completed" for e in entries[start:]):
        free_action = "free_requested"
    marks = sorted(((int(idx), int(n)) for n, idx in markers), key=lambda m: m[0])
    live = {}
    next_id = 0
    lines = []
    info = {"allocs": 0, "frees": 0, "iterations": 0, "unknown_frees": 0,
            "anomalies": 0, "free_action": free_action, "live_at_end": 0,
            "first_event": start, "events": len(entries) - start, "actions": {}}
    actions = info["actions"]
    m = 0
    while m < len(marks) and marks[m][0] < start:  # markers before the capture start
        m += 1
    for idx in range(start, len(entries)):
        while m < len(marks) and marks[m][0] <= idx:
            lines.append(f"i {marks[m][1]}")
            info["iterations"] += 1
            m += 1
        e = entries[idx]
        act = e.get("action")
        actions[act] = actions.get(act, 0) + 1
        if act == "alloc":
            addr = int(e["addr"])
            if addr in live:
                lines.append(f"f {live.pop(addr)}")
                info["anomalies"] += 1
                info["frees"] += 1
            live[addr] = next_id
            lines.append(f"a {next_id} {int(e['size'])} {int(e.get('stream', 0) or 0)}")
            next_id += 1
            info["allocs"] += 1
        elif act == free_action:
            ident = live.pop(int(e["addr"]), None)
            if ident is None:
                info["unknown_frees"] += 1
            else:
                lines.append(f"f {ident}")
                info["frees"] += 1
    while m < len(marks):
        lines.append(f"i {marks[m][1]}")
        info["iterations"] += 1
        m += 1
    info["live_at_end"] = len(live)
    return lines, info


def write_trace(path, lines, meta):
    """Writes a gzip trace: `# key value` lines (meta, in order), then lines."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with gzip.open(tmp, "wt", encoding="ascii", compresslevel=9) as f:
        for k, v in meta.items():
            v = str(v).replace("\n", " ")
            f.write(f"# {k} {v}\n")
        for line in lines:
            f.write(line)
            f.write("\n")
    os.replace(tmp, path)


def read_trace(path):
    """Returns (meta dict, list of event lines) of a trace file (gzip or plain)."""
    opener = gzip.open if _is_gzip(path) else open
    meta = {}
    events = []
    with opener(path, "rt", encoding="ascii", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            if line.startswith("#"):
                parts = line[1:].strip().split(None, 1)
                if parts:
                    meta[parts[0]] = parts[1] if len(parts) > 1 else ""
                continue
            events.append(line)
    return meta, events


def _is_gzip(path):
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def validate(path):
    """Re-reads a trace and checks it: every `a` has an unused id, a byte count
    and a stream; every `f` names a live id; every `i` has a number. Returns a
    dict: ok, errors (the first 20), allocs, frees, iterations, live_at_end,
    peak_live_bytes (each allocation rounded up to 512 bytes, as
    bench/traces/README.md counts it), streams, meta."""
    errors = []
    meta, events = read_trace(path)
    live = {}
    seen = set()
    allocs = frees = iters = 0
    cur = peak = 0
    streams = set()
    for lineno, line in enumerate(events, 1):
        p = line.split()
        try:
            if p[0] == "a" and len(p) == 4:
                ident, size, stream = int(p[1]), int(p[2]), int(p[3])
                if ident in seen:
                    errors.append(f"event {lineno}: id {ident} allocated twice")
                    continue
                if size < 0:
                    errors.append(f"event {lineno}: negative size")
                seen.add(ident)
                rounded = (size + 511) // 512 * 512
                live[ident] = rounded
                cur += rounded
                peak = max(peak, cur)
                streams.add(stream)
                allocs += 1
            elif p[0] == "f" and len(p) == 2:
                ident = int(p[1])
                if ident not in live:
                    errors.append(f"event {lineno}: free of id {ident} that is not live")
                    continue
                cur -= live.pop(ident)
                frees += 1
            elif p[0] == "i" and len(p) == 2:
                int(p[1])
                iters += 1
            else:
                errors.append(f"event {lineno}: cannot parse {line!r}")
        except ValueError:
            errors.append(f"event {lineno}: bad number in {line!r}")
        if len(errors) >= 20:
            break
    return {"ok": not errors and allocs > 0, "errors": errors, "allocs": allocs, "frees": frees,
            "iterations": iters, "live_at_end": len(live), "peak_live_bytes": peak,
            "streams": sorted(streams), "meta": meta, "path": os.path.abspath(path)}


def snapshot_to_trace(snapshot, device=0, markers=(), start=0):
    """Lines and info of one device of a snapshot dict (torch.cuda.memory._snapshot())."""
    traces = snapshot.get("device_traces") or []
    if device >= len(traces):
        return convert_events([], markers, 0)
    return convert_events(traces[device], markers, start)


class TraceRecorder:
    """Records PyTorch's caching-allocator history and writes a gmlake trace.

    with TraceRecorder(path, workload="name") as rec:   # or rec.start() / rec.stop()
        ... rec.iteration(n) at the start of each iteration ...

    The trace is written by stop() (or on leaving the with block, also after an
    exception: then with `# complete no`). stop() returns info: the counts of
    convert_events plus validate()'s result under "validate"."""

    def __init__(self, path, workload="unnamed", device=None, max_entries=None, meta=None):
        self.path = path
        self.workload = workload
        self.device = device
        self.max_entries = max_entries
        self.meta = dict(meta or {})
        self.markers = []
        self.start_index = 0
        self.info = None
        self._running = False
        self._torch = None

    def _trace_len(self):
        snap = self._torch.cuda.memory._snapshot()
        traces = snap.get("device_traces") or []
        return len(traces[self.device]) if self.device < len(traces) else 0

    def start(self):
        global _active
        import torch  # lazy

        self._torch = torch
        if not torch.cuda.is_available():
            raise RuntimeError("TraceRecorder: CUDA is not available")
        backend = "native"
        try:
            backend = torch.cuda.get_allocator_backend()
        except Exception:
            pass
        if backend != "native":
            raise RuntimeError(f"TraceRecorder: allocator backend is {backend!r}; only PyTorch's native "
                               "caching allocator records history (unset PYTORCH_CUDA_ALLOC_CONF backend)")
        if self.device is None:
            self.device = torch.cuda.current_device()
        kwargs = {"enabled": "all", "context": None, "stacks": "python"}
        kwargs["max_entries"] = self.max_entries if self.max_entries else sys.maxsize
        torch.cuda.memory._record_memory_history(**kwargs)
        # events already in the history (an earlier recording) are not ours
        self.start_index = self._trace_len()
        self.markers = []
        self._running = True
        _active = self
        return self

    def iteration(self, n=None):
        """Marks the start of iteration n (default: the next number)."""
        if not self._running:
            return
        if n is None:
            n = self.markers[-1][0] + 1 if self.markers else 0
        self.markers.append((int(n), self._trace_len()))

    def stop(self, complete=True):
        global _active
        if not self._running:
            return self.info
        torch = self._torch
        self._running = False
        if _active is self:
            _active = None
        try:
            torch.cuda.synchronize()
        except Exception:
            pass
        snap = torch.cuda.memory._snapshot()
        try:
            torch.cuda.memory._record_memory_history(enabled=None)
        except Exception:
            pass
        traces = snap.get("device_traces") or []
        entries = traces[self.device] if self.device < len(traces) else []
        wrapped = bool(self.max_entries) and len(entries) >= self.max_entries
        if self.markers and len(entries) < self.markers[-1][1]:
            wrapped = True
        lines, info = convert_events(entries, self.markers, self.start_index)
        meta = {"workload": self.workload,
                "source": f"torch {torch.__version__} caching allocator history"}
        try:
            meta["gpu"] = torch.cuda.get_device_name(self.device)
        except Exception:
            meta["gpu"] = "unknown"
        try:
            meta["torch_peak_allocated"] = torch.cuda.max_memory_allocated(self.device)
            meta["torch_peak_reserved"] = torch.cuda.max_memory_reserved(self.device)
        except Exception:
            pass
        meta.update(self.meta)
        meta["markers"] = "snapshot-index"
        meta["free_action"] = info["free_action"]
        if info["unknown_frees"] or info["anomalies"]:
            meta["skipped_unknown_frees"] = info["unknown_frees"]
            meta["anomalies"] = info["anomalies"]
        if wrapped:
            meta["warning"] = "history ring buffer wrapped: early events lost, markers unreliable"
        if not complete:
            meta["complete"] = "no"
        write_trace(self.path, lines, meta)
        info["wrapped"] = wrapped
        info["path"] = os.path.abspath(self.path)
        info["validate"] = validate(self.path)
        self.info = info
        return info

    def __enter__(self):
        return self.start()

    def __exit__(self, exc_type, exc, tb):
        try:
            self.stop(complete=exc_type is None)
        except Exception as e:  # never mask the job's own exception
            print(f"capture_trace: could not write {self.path}: {type(e).__name__}: {e}", file=sys.stderr)
            if exc_type is None:
                raise
        return False


def mark_iteration(n=None):
    """Marks an iteration on the active recorder (no-op when none records)."""
    if _active is not None:
        _active.iteration(n)


def _main(argv=None):
    import argparse
    import runpy

    # `import capture_trace` inside the recorded script must see this module
    sys.modules.setdefault("capture_trace", sys.modules[__name__])
    argv = list(sys.argv[1:] if argv is None else argv)
    script_argv = []
    if "--" in argv:
        cut = argv.index("--")
        argv, script_argv = argv[:cut], argv[cut + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 usage="%(prog)s --out X.trace.gz [--workload NAME] -- script.py args...\n"
                                       "       %(prog)s --validate X.trace.gz ...\n"
                                       "       %(prog)s --convert snapshot.pickle --out X.trace.gz")
    ap.add_argument("--out", help="trace to write (.trace.gz)")
    ap.add_argument("--workload", help="workload name (default: the script's name)")
    ap.add_argument("--max-entries", type=int, default=0, help="history cap (default: none)")
    ap.add_argument("--validate", nargs="+", metavar="TRACE", help="check traces and print their counts")
    ap.add_argument("--convert", metavar="PICKLE", help="convert a torch.cuda.memory._dump_snapshot pickle")
    ap.add_argument("--device", type=int, default=0, help="device index for --convert")
    args = ap.parse_args(argv)

    if args.validate:
        bad = 0
        for p in args.validate:
            r = validate(p)
            bad += not r["ok"]
            print(f"{p}: {'ok' if r['ok'] else 'INVALID'}: {r['allocs']} allocs, {r['frees']} frees, "
                  f"{r['iterations']} iterations, {r['live_at_end']} live at end, "
                  f"peak live {r['peak_live_bytes'] / 1e9:.3f} GB, streams {r['streams']}")
            for e in r["errors"]:
                print(f"  {e}")
        return 1 if bad else 0
    if args.convert:
        import pickle
        if not args.out:
            ap.error("--convert needs --out")
        with open(args.convert, "rb") as f:
            snap = pickle.load(f)
        lines, info = snapshot_to_trace(snap, args.device)
        meta = {"workload": args.workload or os.path.basename(args.convert).split(".")[0],
                "source": "torch caching allocator history (converted snapshot pickle, no iteration markers)"}
        write_trace(args.out, lines, meta)
        r = validate(args.out)
        print(f"{args.out}: {info['allocs']} allocs, {info['frees']} frees, valid: {r['ok']}")
        return 0 if r["ok"] else 1
    if not args.out or not script_argv:
        ap.error("give --out X.trace.gz -- script.py args...")
    script = script_argv[0]
    workload = args.workload or os.path.splitext(os.path.basename(script))[0]
    sys.argv = script_argv
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    rec = TraceRecorder(args.out, workload=workload, max_entries=args.max_entries or None)
    rc = 0
    with rec:
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    info = rec.info or {}
    v = info.get("validate", {})
    print(f"capture_trace: wrote {args.out}: {info.get('allocs', 0)} allocs, {info.get('frees', 0)} frees, "
          f"{info.get('iterations', 0)} iterations; valid: {v.get('ok')}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(_main())
