#!/usr/bin/python3
"""Replays traces under every combination of a grid of gmlake settings and reports,
per trace, how far fragmentation and driver time can be pushed at once: the least
modelled driver time among the combinations that keep fragmentation at or below a
bound, the least fragmentation among those that keep driver time at or below a
bound, and how many combinations meet both. Then the combinations that meet both
bounds on the most traces.

  python3 bench/settings_sweep.py [--replay build/bench/gmlake-replay] [--jobs N]
                                  [--grid KEY=V1,V2,...]... [--frag PCT] [--driver US]
                                  [--front] [--out FILE.jsonl] [TRACE.trace.gz | DIR]...

Default traces: bench/traces and bench/traces/synthetic. Default grid (360
combinations, about 5 minutes on 2 cores for the 17 shipped traces):

  max_chunk_mib 8,16,32,64,128; (big_chunk_mib, big_growth_mib) (256,768),
  (512,768), (1024,768), (512,256), (1024,256), (2048,512); stitch_edges_mib 0,4;
  min_growth_mib 0,16,64; small_growth_divisor 0,8

A --grid KEY=... replaces that key's values or adds a key (any key of
gmlake/settings.hpp); `--grid big_chunk_mib/big_growth_mib=512/768,1024/256` sets
the pair (one of the pair given alone drops the pair: the other keeps its default). Bounds
default to the limits of 1% fragmentation and 1 ms per iteration after iteration 4.
Driver time is gmlake-replay's model of the H200 (bench/h200-vmm-cost-model.txt):
it ranks settings; a verdict on the device takes gmlake-gpu-replay.
--out keeps every row (with its "settings") for other cuts. --front prints, per
trace, the combinations that no other beats on both fragmentation and driver time:
with a trace of one's own job (examples/record_trace, or the PyTorch plugin's
capture), the settings to choose from for it.
"""
import argparse
import concurrent.futures
import glob
import itertools
import json
import os
import sys

from run_benchmarks import replay_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DEFAULT_GRID = {
    "max_chunk_mib": ["8", "16", "32", "64", "128"],
    "big_chunk_mib/big_growth_mib": ["256/768", "512/768", "1024/768", "512/256", "1024/256", "2048/512"],
    "stitch_edges_mib": ["0", "4"],
    "min_growth_mib": ["0", "16", "64"],
    "small_growth_divisor": ["0", "8"],
}


def traces_of(args):
    paths = args or [os.path.join(ROOT, "bench", "traces"), os.path.join(ROOT, "bench", "traces", "synthetic")]
    out = []
    for p in paths:
        out += sorted(glob.glob(os.path.join(p, "*.trace.gz"))) if os.path.isdir(p) else [p]
    return out


def combinations(grid):
    """Settings texts, one per combination: "key:value,...". A key "a/b" with values
    "x/y" sets a to x and b to y."""
    keys = list(grid)
    for values in itertools.product(*(grid[k] for k in keys)):
        items = []
        for k, v in zip(keys, values):
            ks, vs = k.split("/"), v.split("/")
            if len(ks) != len(vs):
                sys.exit(f"settings_sweep: {k}={v}: one value per key")
            items += [f"{a}:{b}" for a, b in zip(ks, vs)]
        yield ",".join(items)


def replay(exe, settings, traces):
    rows = replay_json(exe, ["--config", "gmlake", "--settings", settings], *traces)
    for r in rows:
        r["settings"] = settings
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replay", default=os.path.join(ROOT, "build", "bench", "gmlake-replay"))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2")
    ap.add_argument("--frag", type=float, default=1.0, help="fragmentation bound, percent")
    ap.add_argument("--driver", type=float, default=1000.0, help="driver time bound, us per iteration after i 4")
    ap.add_argument("--out", help="every row as JSON lines")
    ap.add_argument("--front", action="store_true", help="print each trace's front")
    ap.add_argument("traces", nargs="*")
    a = ap.parse_args()

    grid = dict(DEFAULT_GRID)
    for g in a.grid:
        key, _, values = g.partition("=")
        if not values:
            sys.exit(f"settings_sweep: --grid {g}: KEY=V1,V2,...")
        for k in list(grid):  # a key given alone replaces the pair it belongs to
            if key != k and key in k.split("/"):
                del grid[k]
        grid[key] = values.split(",")
    traces = traces_of(a.traces)
    combos = list(combinations(grid))
    print(f"{len(combos)} combinations x {len(traces)} traces", file=sys.stderr)

    rows = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
        for i, r in enumerate(pool.map(lambda s: replay(a.replay, s, traces), combos)):
            rows += r
            if sys.stderr.isatty():
                print(f"\r{i + 1}/{len(combos)}", end="", file=sys.stderr)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    if a.out:
        with open(a.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")

    by = {}  # settings -> trace -> row
    for r in rows:
        by.setdefault(r["settings"], {})[r["trace"]] = r
    names = sorted({r["trace"] for r in rows})

    def frag(r):
        return 100 * r["fragmentation"]

    def drv(r):
        return r["driver_us_per_iter_after_4"]

    def both(r):
        return frag(r) <= a.frag and drv(r) <= a.driver

    print(f"| trace | least driver us/iter with fragmentation <= {a.frag:g}% | "
          f"least fragmentation with driver <= {a.driver:g} us | combinations meeting both |")
    print("|---|---|---|---|")
    for t in names:
        rs = [s[t] for s in by.values() if t in s]
        lo_d = min((r for r in rs if frag(r) <= a.frag), key=drv, default=None)
        lo_f = min((r for r in rs if drv(r) <= a.driver), key=frag, default=None)
        d = f"{drv(lo_d):.0f} ({frag(lo_d):.2f}%)" if lo_d else "none"
        f = f"{frag(lo_f):.2f}% ({drv(lo_f):.0f} us)" if lo_f else "none"
        print(f"| {t} | {d} | {f} | {sum(both(r) for r in rs)} of {len(rs)} |")
    ranked = sorted(by.items(), key=lambda kv: (-sum(both(r) for r in kv[1].values()),
                                                sum(frag(r) for r in kv[1].values())))
    print(f"\nMost traces within both bounds (of {len(names)}):")
    for s, rs in ranked[:5]:
        miss = ", ".join(f"{t} {frag(r):.2f}% {drv(r):.0f} us" for t, r in sorted(rs.items()) if not both(r))
        print(f"  {sum(both(r) for r in rs.values())}  {s}\n      outside: {miss or 'none'}")

    if a.front:
        for t in names:
            rs = sorted((s[t] for s in by.values() if t in s), key=lambda r: (frag(r), drv(r)))
            front, best = [], float("inf")
            for r in rs:  # by fragmentation; kept where driver time is below every one before
                if drv(r) < best:
                    front.append(r)
                    best = drv(r)
            print(f"\n{t}: fragmentation, driver us/iter after i 4, settings")
            for r in front:
                print(f"  {frag(r):6.2f}%  {drv(r):8.0f}  {r['settings']}")


if __name__ == "__main__":
    main()
