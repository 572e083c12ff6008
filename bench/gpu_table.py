#!/usr/bin/env python3
"""Turns gmlake-gpu-replay JSON lines into the markdown table of docs/benchmarks.md.

    python3 bench/gpu_table.py replay.jsonl > table.md

Per trace: each allocator's own peak reserved, the device's view of it, fragmentation
(1 - peak live / peak reserved), time per allocate/free after iteration 4, and for
gmlake the measured driver time per iteration after 4; then whether gmlake is at or
below the best peer, and at or below PyTorch's default time per operation.
"""
import json
import sys

ORDER = ["gmlake", "torch-default", "torch-expandable", "cudaMallocAsync"]


def main(path):
    rows = {}
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        rows.setdefault(r["trace"], {})[r["allocator"]] = r
    out = []
    out.append("| trace | allocator | peak live GB | peak reserved GB (own) | device view GB | frag | ns/op after i4 "
               "| driver us/iter after i4 | new device allocs after i4 | failed |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    verdicts = []
    for trace in sorted(rows):
        by = rows[trace]
        for name in ORDER + sorted(set(by) - set(ORDER)):
            r = by.get(name)
            if r is None:
                continue
            drv = f"{r['driver_us_per_iter_after_4']:.1f}" if name == "gmlake" else "n/a"
            out.append(f"| {trace} | {name} | {r['peak_live_bytes']/1e9:.2f} | {r['peak_reserved_bytes']/1e9:.2f} "
                       f"| {r['device_peak_bytes']/1e9:.2f} | {100*r['fragmentation']:.1f}% | {r['ns_per_op_after_4']:.0f} "
                       f"| {drv} | {r['device_allocs_after_4']} | {r['failed']} |")
        g = by.get("gmlake")
        peers = [by[n] for n in ORDER[1:] if n in by]
        if g and peers:
            best = min(peers, key=lambda r: r["peak_reserved_bytes"])
            mem_ok = g["peak_reserved_bytes"] <= best["peak_reserved_bytes"]
            t = by.get("torch-default")
            time_ok = t is not None and g["ns_per_op_after_4"] <= t["ns_per_op_after_4"]
            verdicts.append(
                f"- {trace}: gmlake {g['peak_reserved_bytes']/1e9:.2f} GB vs best peer {best['allocator']} "
                f"{best['peak_reserved_bytes']/1e9:.2f} GB: {'at or below' if mem_ok else 'ABOVE'}; "
                f"{g['ns_per_op_after_4']:.0f} ns/op vs PyTorch default "
                f"{t['ns_per_op_after_4'] if t else float('nan'):.0f}: {'at or below' if time_ok else 'ABOVE'}")
    print("\n".join(out))
    print()
    print("\n".join(verdicts))


if __name__ == "__main__":
    main(sys.argv[1])
