#!/usr/bin/env python3
"""Turns gmlake-gpu-replay JSON lines into the markdown table of docs/benchmarks.md.

    python3 bench/gpu_table.py replay.jsonl > table.md
    python3 bench/gpu_table.py replay.jsonl --into docs/benchmarks.md

--into writes the section "On the H200" into the file, between the markers
<!-- h200 --> and <!-- /h200 --> (appended with them when absent);
bench/run_benchmarks.py does so with bench/results/h200-replay.jsonl.

Per trace: each allocator's own peak reserved, the device's view of it, fragmentation
(1 - peak live / peak reserved), time per allocate/free after iteration 4, and for
gmlake the measured driver time per iteration after 4; then whether gmlake is at or
below the best peer, and at or below PyTorch's default time per operation.
--into also adds the full tables of TABLES (other runs) and the before/after tables of COMPARISONS (gmlake's figures of two
builds, from runs kept in bench/results) whose runs are there.
"""
import json
import os
import sys

ORDER = ["gmlake", "torch-default", "torch-expandable", "cudaMallocAsync"]


def table(path):
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
            drv = f"{r['driver_us_per_iter_after_4']:.1f}" if name.startswith("gmlake") else "n/a"
            out.append(f"| {trace} | {name} | {r['peak_live_bytes']/1e9:.2f} | {r['peak_reserved_bytes']/1e9:.2f} "
                       f"| {r['device_peak_bytes']/1e9:.2f} | {100*r['fragmentation']:.2f}% | {r['ns_per_op_after_4']:.0f} "
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
    return "\n".join(out) + "\n\n" + "\n".join(verdicts) + "\n"


HEADER = """## On the H200

Every trace of bench/traces (recorded from PyTorch jobs on the H200) and of
bench/traces/synthetic, replayed on one
NVIDIA H200 (CUDA 13.0, driver 580.159, torch 2.11.0+cu130) by `gmlake-gpu-replay`, one
process per trace and allocator, streams honoured (each trace stream a CUDA stream;
frees on the allocating stream): gmlake's default allocator on the CUDA VMM backend,
PyTorch's caching allocator through libtorch's `raw_alloc_with_stream`/`raw_delete` (default, and `expandable_segments:True`),
and `cudaMallocAsync` on the device's default pool (release threshold: never). All in
C++, in the same run. Peak reserved is each allocator's own high-water mark; the device
view is the largest drop of `cudaMemGetInfo`'s free bytes at iteration markers and at
the end (they agree). ns/op: wall time of the replay loop after the `i 4` marker over
the allocate and free calls (loop overhead included). Driver us/iter: measured time
inside CUDA driver calls after `i 4` (gmlake only; the peers' device allocations are
counted instead).

Command (on the GPU machine): `bash .ci/gpu OUT bench/traces/*.trace.gz bench/traces/synthetic/*.trace.gz`
(`GMLAKE_BIN=DIR` to use binaries built elsewhere), then
`python3 bench/gpu_table.py OUT/replay.jsonl`; these figures: `bench/results/h200-replay.jsonl`
(2026-12-04, the build of commit e5c4172; later builds' runs, on the H200 and on
the H100, follow).

"""


def load(path):
    rows = {}
    for line in open(path):
        if line.strip().startswith("{"):
            r = json.loads(line)
            rows.setdefault(r["trace"], {})[r["allocator"]] = r
    return rows


RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

# The before/after tables of docs/benchmarks.md: title, text, the runs compared
# (files of bench/results, or tuples of repeated runs of one build; None: the run
# the section shows) and, where both are rows of the same runs, the allocator label
# of the before rows.
COMPARISONS = [
    ("Before and after on the H100: a cached block's start moved",
     """gmlake's rows of four runs of `gmlake-gpu-replay --allocator gmlake TRACE` per trace (the
17 traces), alternated build by build in one call on one NVIDIA H100 80GB HBM3 (driver
580.159.04) on 2026-12-07, right after a run of the GPU job on the build of commit 10b28df: before,
the build of commit a26aace; after, the build whose cached stitched blocks may start
elsewhere in their first chunk (commit 10b28df); in the order before, after, before, after
(`bench/results/h100-ab-a26aace-before-1.jsonl`, `-before-2`, `-after-1`, `-after-2`).
Peak reserved and device allocations after i 4 equal the host replay's of each build on
every trace; only llama-small-lora-ckpt changes (1.74 -> 1.82%, 5 -> 7 device allocations
after i 4): its driver time after i 4 falls from 2295 and 2152 us to 1649 and 1564, and its
ns/op after i 4 from 787 and 742 to 606 and 592. The other traces' times vary between the
two runs of one build as much as between the builds.
""", ("h100-ab-a26aace-before-1.jsonl", "h100-ab-a26aace-before-2.jsonl"),
     ("h100-ab-a26aace-after-1.jsonl", "h100-ab-a26aace-after-2.jsonl")),
    ("Before and after on the H100: one chunk per request",
     """gmlake's rows of four runs of `gmlake-gpu-replay --allocator gmlake TRACE` per trace (the
17 traces), alternated build by build in one call on one NVIDIA H100 80GB HBM3 (driver
580.159.04) on 2026-12-07, right after the run of "On the H100: the build of commit
ec599a9": before, the build of commit 3541ccb; after, the build with one chunk per request
(commit ec599a9);
in the order before, after, before, after (`bench/results/h100-ab-3541ccb-before-1.jsonl`,
`-before-2`, `-after-1`, `-after-2`). Peak reserved and device allocations after i 4
equal the host replay's of each build on every trace, and fragmentation is the same in
both builds on every trace. Device allocations after i 4 fall on gpt2l-fsdp-dyn (108 ->
84) and synth-seqsched (6 -> 3), and llama3b-dynbatch makes 149 driver calls after i 4
instead of 158 (the host replay models 217 -> 150 us). The measured times of this
instance vary more between two runs of one build than the change moves them
(gpt2l-fsdp-dyn before: 851 and 976 us; after: 968 and 730): compare the calls, which
are the same in every run.
""", ("h100-ab-3541ccb-before-1.jsonl", "h100-ab-3541ccb-before-2.jsonl"),
     ("h100-ab-3541ccb-after-1.jsonl", "h100-ab-3541ccb-after-2.jsonl")),
    ("Before and after on the H200: growth and placement since dde0201",
     """gmlake's rows of four runs of `gmlake-gpu-replay --allocator gmlake TRACE` per trace (the
17 traces), alternated build by build in one call on one NVIDIA H200 (driver
580.159.04) on 2026-12-07: before, the build of commit dde0201 (before repair, stitch
edges by default, appending, the small arena's growth, settled growth and borrowing);
after, the build of commit 3541ccb; in the order before,
after, before, after (`bench/results/h200-ab-dde0201-before-1.jsonl`, `-before-2`,
`-after-1`, `-after-2`). Peak reserved and device allocations after i 4 equal the host
replay's of each build on every trace. Fragmentation falls on 13 traces and stays the
same on 4. Measured driver time is lower in both runs after than in both before on 10
traces (llama1b-generate 2330 and 1781 -> 1157 and 1135 us, gpt2l-fsdp-dyn 1896 and
1733 -> 1063 and 811) and higher on 3: synth-kvcache 0 -> 57 and 77 us (the chunks its
small arena borrows after warm-up, which bring it from 3.34 to 1.42%), opt1.3b-ckpt 0 ->
3 and 14, synth-vision 9 and 10 -> 13 and 17; on the other 4 the two builds' runs
overlap (synth-ckpt-dyn, synth-mixed, synth-moe) or make no driver call after i 4
(synth-offload).
""", ("h200-ab-dde0201-before-1.jsonl", "h200-ab-dde0201-before-2.jsonl"),
     ("h200-ab-dde0201-after-1.jsonl", "h200-ab-dde0201-after-2.jsonl")),
    ("Before and after: the fit strategy's inlined walk",
     """gmlake's rows of four runs of `gmlake-gpu-replay --allocator gmlake TRACE` per trace (the
17 traces), alternated trace by trace: the build before (commit ebce8fd: every request's
fit strategy walks the free ranges through the type-erased `free_view`), the build after
(the library's strategies, generic over the view, walk the arena's free index inlined),
after again, before again; both replays built on the development machine, run in one call
on an NVIDIA H100 80GB HBM3 (driver 580.159.04) on 2026-12-06, after the GPU tests on the
new headers (16/16, 28,330 assertions: `bench/results/h100-gpu-tests-fit.txt`;
`bench/results/h100-ab-fit-before-1.jsonl`, `-before-2`, `-after-1`, `-after-2`). Every
placement is the same: fragmentation and device allocations equal the host replay's in
all four runs. Each time column shows the two runs. The host replay measures 7-10% less
time per operation (docs/design.md, "The concepts"); here the two runs of one build differ
by more than that on most traces (llama1b-generate after: 121 and 84 ns/op), and the ratio
of the builds' best runs ranges from 0.66 to 1.47 (median 0.95). This instance measured
86-87 ns/op for llama1b-generate with the build before, against 142 and 151 for the same
build in the run of "Before and after: every change since commit dde0201": compare time
only within one run.
""", ("h100-ab-fit-before-1.jsonl", "h100-ab-fit-before-2.jsonl"),
     ("h100-ab-fit-after-1.jsonl", "h100-ab-fit-after-2.jsonl")),
    ("Before and after: every change since commit dde0201",
     """gmlake's rows of four runs of `gmlake-gpu-replay --allocator gmlake TRACE` per trace (the
17 traces), alternated trace by trace: the build of commit dde0201 (before repair, stitch edges by
default, appending, the small arena's growth, settled growth and borrowing), the build of commit
ebce8fd, that build again, then dde0201 again; both replays built on the
development machine, run in one call on an NVIDIA H100 80GB HBM3 (driver 580.159.04) on
2026-12-06 (`bench/results/h100-ab-dde0201-before-1.jsonl`, `-before-2`, `-after-1`,
`-after-2`). Each time column shows the two runs. Fragmentation and device allocations
after i 4 equal the host replay's of each build on every trace ("Before and after: growth
and placement since commit dde0201" above). Mean fragmentation over the 17 traces
1.15 -> 0.59%; mean measured driver time 803 and 704 -> 506 and 512 us per iteration;
traces above 1 ms 6 and 5 -> 3 and 3 (llama-small-lora-ckpt and llama1b-generate in
both, gpt2l-fsdp-dyn in the first, 1243 us, moe-small-dynseq in the second, 1038 us).
gmlake's own time per operation rose on the two generation traces, llama1b-generate
89 and 80 -> 142 and 151 ns/op and synth-kvcache 63 and 94 -> 121 and 124, outside the
driver calls (llama1b-generate's driver time fell); it stays below PyTorch default's
there (497 and 415 ns/op in the run of "On the H100: the build of commit ebce8fd"). Another
instance measured the same after build at 86-87 ns/op on llama1b-generate and 65-69 on
synth-kvcache ("Before and after: the fit strategy's inlined walk"), so part of that rise
is the machine; on the host replay gmlake's own time on synth-kvcache rose from 35.7 to
44 ns/op (best of five), which the inlined walk brings to 40.
""", ("h100-ab-dde0201-before-1.jsonl", "h100-ab-dde0201-before-2.jsonl"),
     ("h100-ab-dde0201-after-1.jsonl", "h100-ab-dde0201-after-2.jsonl")),
    ("Before and after: borrowing with its conditions",
     """gmlake's rows (after: the default, borrowing once settled, only chunks no stitched
block maps and only while the live bytes are below 4/5 of their peak; repair with new
chunks) and `gmlake:borrow_max_mib:0`'s (before: no borrowing) of the two runs of
"On the H100: the build of commit ebce8fd" above (`bench/results/h100-replay-borrow-default.jsonl`,
`-2`). Each time column shows the two runs. Fragmentation and device allocations after
i 4 equal the host replay's on every trace in both runs: synth-kvcache 3.34 -> 1.42%,
llama3b-dynbatch 1.05 -> 0.83% (39 -> 17 device allocations), llama-small-lora-ckpt
1.82 -> 1.74%, synth-moe 0.32 -> 0.23%; gpt2s-dynseq 0.28 -> 0.30%. synth-kvcache
pays for its gain with about 80 us of maps per iteration where it had none.
""", ("h100-replay-borrow-default.jsonl", "h100-replay-borrow-default-2.jsonl"),
     ("h100-replay-borrow-default.jsonl", "h100-replay-borrow-default-2.jsonl"), "gmlake:borrow_max_mib:0", "gmlake"),
    ("Borrowing without its conditions",
     """gmlake's rows (before: no borrowing, the default of that build) and
`gmlake:borrow_max_mib:16`'s (after: borrowing once settled, at any live bytes and of
any free chunk, the first version) of one run, on an NVIDIA H100 80GB HBM3 (driver 580.159; the build of
commit cd5fd33): `GMLAKE_GPU_PARTS=replay GMLAKE_GPU_SETTINGS="borrow_max_mib:16" bash
.ci/gpu OUT TRACES`, the 17 traces (`bench/results/h100-replay-borrow.jsonl`).
Fragmentation and device allocations after i 4 of both equal the host replay's on
every trace. It is the trade of docs/design.md ("Borrowing a chunk between the
arenas"): synth-kvcache, a generation job, 3.34 -> 1.42%, llama3b-dynbatch 1.05 ->
0.77%; llama1b-lora-ckpt 1.20 -> 3.59% and synth-mixed 0.79 -> 3.13%, whose small
tensors placed in borrowed chunks live on, and chunks under cached stitched blocks
were borrowed. The default since borrows only chunks no stitched block maps, and only
while the live bytes are below 4/5 of their peak: its figures are the host replay's (Summary above).
""", "h100-replay-borrow.jsonl", "h100-replay-borrow.jsonl", "gmlake", "gmlake:borrow_max_mib:16"),
    ("Before and after: settled growth",
     """gmlake's rows (after: settled growth on, the default) and `gmlake:settle_window:0`'s
(before: off) of two runs of the same command in one call, on an NVIDIA H100 80GB HBM3
(driver 580.159; the build of commit 85f1a29): `GMLAKE_GPU_SETTINGS="settle_window:0"
bash .ci/gpu OUT TRACES`, the 17 traces, then the same with `GMLAKE_GPU_PARTS=replay`
(`bench/results/h100-replay-settled.jsonl`, `-2`). Before and after ran in the same
runs, trace by trace, so their times compare; each time column shows the two runs.
Fragmentation and device allocations after i 4 equal the host replay's in both runs.
Device allocations after i 4 fall on 9 traces (gpt2l-fsdp-dyn 229 -> 108,
moe-small-dynseq 55 -> 19) and stay the same on the other 8; measured driver time falls in both runs on 9 traces (gpt2l-fsdp-dyn by 50
and 59%, moe-small-dynseq by 66 and 45%), and on the others the two runs of one build
differ more than the builds do. It stays above 1 ms on llama-small-lora-ckpt and
llama1b-generate (measured 1793 and 1845 us on this machine against 1202 modelled),
and crossed it in one of the two runs on gpt2l-fsdp-dyn (1199 us) and gpt2s-dynseq
(1246 us). gmlake's ns/op is above PyTorch default's on llama-small-lora-ckpt in
both runs (479 against 401, 541 against 398) and on synth-ckpt-dyn in the first (744
against 338; 261 against 315 in the second).
""", ("h100-replay-settled.jsonl", "h100-replay-settled-2.jsonl"),
     ("h100-replay-settled.jsonl", "h100-replay-settled-2.jsonl"), "gmlake:settle_window:0"),
    ("Before and after: the small arena's growth",
     """gmlake's rows of four runs of the same command (`GMLAKE_GPU_PARTS=replay bash .ci/gpu
OUT TRACES`, the 17 traces) in one call on one machine, alternated: after, before,
after, before. After: the small arena grows by at least 1/8 of its reserved bytes
(rounded down to the slot), up to 8 MiB, in one chunk (commit e5c4172;
`bench/results/h200-ab-after-1.jsonl`, `-2`). Before: one slot per growth (commit
886f97d; `h200-ab-before-1.jsonl`, `-2`). Each
time column shows the two runs. Fragmentation and device allocations after i 4 equal
the host replay's in every run; device allocations fall where the small arena grows
after warm-up (llama3b-dynbatch 105 -> 39, llama1b-lora-ckpt 20 -> 11,
llama1b-generate 36 -> 29, llama1b-dynbatch 6 -> 2). Measured driver time differs by up
to 45% between two runs of the same build on this machine (llama1b-generate after:
2856 and 1976 us; gpt2l-fsdp-dyn, whose calls barely differ between the builds, 230
and 229 device allocations: 2050 and 1653 us before, 2769 and 1998 after), more than
the change on most traces; llama3b-dynbatch, with the most small-arena growth, went
from 703 and 912 us to 519 and 381.
""", ("h200-ab-before-1.jsonl", "h200-ab-before-2.jsonl"), ("h200-ab-after-1.jsonl", "h200-ab-after-2.jsonl")),
    ("Before and after: appending to cached stitched blocks, lending without waiting",
     """gmlake's rows of the run of commit f3e25a7 (appending on, lending that never
waits; `bench/results/h200-replay-lending.jsonl`) and of the same command on the
build before both (commit 6b1a5b4, `bench/results/h200-replay-edges.jsonl`). In between, the build with appending but
still waiting before lending ran too (commit 79a48ea, `h200-replay-append.jsonl`):
its fragmentation and device allocations are those of the f3e25a7 run on every trace.
Only llama3b-dynbatch changes in memory (1.40 -> 1.05%, as in the host replay). The
three runs were on different machine instances, the f3e25a7 one mostly the slowest:
PyTorch default's ns/op on the same traces was 0.8 to 2.0 times that of the 79a48ea
run (1.5 times or more on 9 of 17), and gmlake's driver time on gpt2m-dynseq, whose
calls are the same in every build, 691 us against 447; compare fragmentation
across runs, and time only within one run.
""", "h200-replay-edges.jsonl", "h200-replay-lending.jsonl"),
    ("Before and after: stitch edges by default",
     """gmlake's rows of the run with stitch edges of 4 MiB, the default (commit 6b1a5b4,
`bench/results/h200-replay-edges.jsonl`), and of the same command on the build
before it, the same day (commit 617e10c, no edges;
`bench/results/h200-replay-noedges.jsonl`: its run of the 14 traces and that of the
three captures, `h200-replay-captures.jsonl`). The runs were on different machine
instances: compare fragmentation, which does not depend on the machine, and time
within one run.
""", "h200-replay-noedges.jsonl", "h200-replay-edges.jsonl"),
    ("Before and after: repairing cached stitched blocks",
     """gmlake's rows of two runs of the same command on the H200, the same day: before,
the build without repair (`bench/results/h200-replay-norepair.jsonl`); after, the
build with it (`bench/results/h200-replay-repair.jsonl`; `options::repair_chunks` 4,
the default; that build waited for the work before a block's free where it was not
done, the current one never waits and makes the same repairs in the host replay).
Only llama-small-lora-ckpt, llama1b-generate and synth-mixed repair blocks (5, 4 and
1 repairs in the simulated replay); every other trace makes the same calls in both
builds, so its differences are the run-to-run variation of measured time
(gpt2s-dynseq: 1158 and 1422 us).
""", "h200-replay-norepair.jsonl", "h200-replay-repair.jsonl"),
]


# Full tables of other runs (every allocator), shown after the main one: title, text, file.
TABLES = [
    ("On the H100: the current build",
     """The same command on the current build (commit 554e02c: the allocator of e55ee6e with
`forget_stream`, which changes no figure, and the extension's statistics, memory fraction
and history fixes), on an NVIDIA H100 80GB HBM3 (driver 580.159.04, CUDA 13.0, torch
2.11.0+cu130) on 2026-12-08; every other figure of this run is that machine's. One call:
`GMLAKE_BIN=... bash .ci/gpu OUT TRACES` (the 17 traces; GPU tests 18/18 (28,371
assertions), plainly and under memcheck with 0 errors, example 0 of 8,388,608 values
wrong, plugin, torch 17/17: `bench/results/h100-gpu-job-554e02c.txt`; the table:
`bench/results/h100-replay-554e02c.jsonl`; driver time by call: `.err`). Peak reserved,
fragmentation and device allocations after i 4 of gmlake equal the host replay's on every
trace. gmlake reserves no more than the best peer on 16 of the 17 traces (synth-moe: 7.60
GB against `cudaMallocAsync`'s 7.58). Its ns/op after i 4 is at or below PyTorch
default's on 16 (llama-small-lora-ckpt: 858 against 499, its two iterations after i 4
holding 4.9 ms of driver calls). Measured driver time is above 1 ms on
llama-small-lora-ckpt (2453 us) and llama1b-generate (1560). `cuMemSetAccess` is most of
it: 2185 and 1039 us per iteration there, 2.1 and 1.6 times what the host replay's cost
model (the H200's measured cost per handle) gives for the same calls.

Builds with the same replay figures (commits that change no figure of the host replay) ran the
same job on ten other H100 instances (all but llama-small-lora-ckpt's figures are
this build's too before e55ee6e); in each the tests of the day passed and gmlake's peaks equal the host replay's:

| commit | driver time above 1 ms (us per iteration after i 4) | ns/op after i 4 above PyTorch default's | files |
|---|---|---|---|
| b3b9efe (`forget_stream`) | gpt2l-fsdp-dyn 1127, llama-small-lora-ckpt 1182, llama1b-generate 2040, synth-mixed 1069 | none | `h100-gpu-job-b3b9efe.txt`, `h100-replay-b3b9efe.jsonl` |
| 10b28df | gpt2l-fsdp-dyn 1134, llama-small-lora-ckpt 1624, llama1b-generate 1601 | none | `h100-gpu-job-10b28df.txt`, `h100-replay-10b28df.jsonl` |
| 5041e74 (the code reorganized) | llama-small-lora-ckpt 1722, llama1b-generate 1210 | llama-small-lora-ckpt 652 / 624, synth-mixed 409 / 379 | `h100-gpu-job-5041e74.txt`, `h100-replay-5041e74.jsonl` |
| ca87a5d (pool code merged into shared helpers) | llama-small-lora-ckpt 1215, llama1b-generate 1136 | gpt2s-dynseq 604 / 448, llama-small-lora-ckpt 435 / 391, synth-mixed 382 / 360 | `h100-gpu-job-ca87a5d.txt`, `h100-replay-ca87a5d.jsonl` |
| ae1f281 (`slide()` returning at once where blocks may not move; this instance was slower than the one before for 61 of the 68 allocator-trace pairs) | llama-small-lora-ckpt 1694, llama1b-generate 1533 | llama-small-lora-ckpt 649 / 585, moe-small-dynseq 473 / 465 | `h100-gpu-job-ae1f281.txt`, `h100-replay-ae1f281.jsonl`, `.err` |
| 4f3deb0 (alignments bounded by `max_alignment()`) | gpt2l-fsdp-dyn 1058, llama-small-lora-ckpt 1757, llama1b-generate 1512 | llama-small-lora-ckpt 670 / 551 | `h100-gpu-job-4f3deb0.txt`, `h100-replay-4f3deb0.jsonl` |
| b819613 (stream order and capture mode kept when calls fail) | llama-small-lora-ckpt 1654, llama1b-generate 1409, synth-mixed 1111 | none | `h100-gpu-job-b819613.txt`, `h100-replay-b819613.jsonl` |
| 16ff153 (two helpers folded) | llama-small-lora-ckpt 1482, llama1b-generate 1150 | none | `h100-gpu-job-16ff153.txt`, `h100-replay-16ff153.jsonl` |
| 47c3696 (a release stops at its range's end; calls cost more on that instance: the same calls as 16ff153's) | gpt2s-dynseq 3053, gpt2l-fsdp-dyn 1021, llama-small-lora-ckpt 1708, llama1b-generate 1228 | gpt2s-dynseq 1373 / 789, synth-mixed 412 / 385 | `h100-gpu-job-47c3696.txt`, `h100-replay-47c3696.jsonl` |
| e55ee6e (repair with new chunks of up to twice the stitch's new bytes: llama-small-lora-ckpt 1.74%; the per-thread default stream kept apart per thread; under memcheck one check failed, the new test's assertion that its kernel still ran, since dropped) | gpt2l-fsdp-dyn 1028, llama-small-lora-ckpt 1661, llama1b-generate 1710 | none | `h100-gpu-job-e55ee6e.txt`, `h100-replay-e55ee6e.jsonl` |

The files are in `bench/results/`.
""", "h100-replay-554e02c.jsonl"),
    ("On the H100: the build of commit ec599a9",
     """The same command on the build of commit ec599a9 (a growth that one
request fills is one chunk once the job has settled or when it is big), on an NVIDIA H100
80GB HBM3 (driver 580.159.04, CUDA 13.0, torch 2.11.0+cu130) on 2026-12-07; every other figure of this run is that machine's. One call:
`GMLAKE_BIN=... bash .ci/gpu OUT TRACES` (the 17 traces; GPU tests 16/16, 28,330
assertions, plainly and under memcheck with 0 errors, example, plugin, torch 12/12:
`bench/results/h100-gpu-job-ec599a9.txt`; the table: `bench/results/h100-replay-ec599a9.jsonl`),
and `GMLAKE_GPU_PARTS=replay` once more later that day on another H100 instance
(`-2`). Peak reserved, fragmentation and device allocations after i 4 of gmlake equal
the host replay's on every trace in both runs. gmlake reserves no more than the best
peer on 16 of the 17 traces (synth-moe: 7.60 GB against `cudaMallocAsync`'s 7.58).
Measured driver time is above 1 ms on llama-small-lora-ckpt (1644 and 2240 us in the
two runs) and llama1b-generate (1724 and 1580); gpt2l-fsdp-dyn measured 944 and 698.
gmlake's ns/op is above PyTorch default's on gpt2s-dynseq in the first run (595 against
528; 434 against 691 in the second) and on llama-small-lora-ckpt in the second (725
against 446; 538 against 630 in the first), at or below it on the other 15 in both.
""", "h100-replay-ec599a9.jsonl"),
    ("On the H200: the build of commit 3541ccb",
     """The same command on the build of commit 3541ccb (before one chunk per request), on an NVIDIA H200
(143771 MiB, driver 580.159.04, CUDA 13.0, torch 2.11.0+cu130) on 2026-12-07. One call:
`GMLAKE_BIN=... bash .ci/gpu OUT TRACES` (the 17 traces; GPU tests 16/16, 28,330
assertions, plainly and under memcheck with 0 errors, example, plugin, torch 12/12:
`bench/results/h200-gpu-job-3541ccb.txt`), then `GMLAKE_GPU_PARTS=replay` once more on
the same machine. The table is the first run (`bench/results/h200-replay-3541ccb.jsonl`;
the second: `-2`). Peak reserved, fragmentation and device allocations after i 4 of
gmlake equal the host replay's on every trace in both runs. gmlake reserves no more than
the best peer on 16 of the 17 traces; on synth-moe it reserves 7.60 GB against
`cudaMallocAsync`'s 7.58. Measured driver time is above 1 ms on gpt2l-fsdp-dyn (1050
and 1196 us in the two runs), llama-small-lora-ckpt (2204 and 2132) and
llama1b-generate (1115 and 1331). gmlake's ns/op is above PyTorch default's on
llama-small-lora-ckpt (753 against 428, 750 against 639) and synth-ckpt-dyn (436
against 404, 365 against 339) in both runs, and on gpt2s-dynseq in the first (498
against 484; 505 against 697 in the second).
""", "h200-replay-3541ccb.jsonl"),
    ("On the H100: the build of commit ebce8fd",
     """The same command on the build of commit ebce8fd (borrowing by default, repair
with new chunks), on an NVIDIA H100 80GB HBM3 (driver 580.159.04, CUDA 13.0, torch
2.11.0+cu130) on 2026-12-06; every other figure of this run is
that machine's. One call: `GMLAKE_BIN=... GMLAKE_GPU_SETTINGS="borrow_max_mib:0" bash
.ci/gpu OUT TRACES` (the 17 traces; GPU tests 16/16, 28,330 assertions, plainly and under
memcheck with 0 errors, example, plugin, torch 12/12: `bench/results/h100-gpu-job-borrow-default.txt`),
then `GMLAKE_GPU_PARTS=replay` with the same settings once more. The table is the first
run (`bench/results/h100-replay-borrow-default.jsonl`; the second: `-2`). Peak reserved,
fragmentation and device allocations after i 4 of gmlake equal the host replay's on every
trace in both runs. The 80 GB card caps PyTorch default's device view on llama1b-dynbatch
and llama3b-dynbatch (its own peak is larger). Measured driver time stays above 1 ms on
llama-small-lora-ckpt (1714 and 2390 us in the two runs) and llama1b-generate (1702 and
1264); gmlake's ns/op is above PyTorch default's on llama-small-lora-ckpt in both runs
(570 against 543, 827 against 674) and on gpt2s-dynseq in the second (660 against 641;
465 against 744 in the first).
""", "h100-replay-borrow-default.jsonl"),
]


def tables():
    out = ""
    for title, text, f in TABLES:
        path = os.path.join(RESULTS, f)
        if os.path.exists(path):
            out += f"### {title}\n\n{text}\n" + table(path) + "\n"
    return out


def before_after(title, text, before, after, before_label="gmlake", after_label="gmlake"):
    """before, after: the files of one or more runs of each build (their times are
    shown side by side; fragmentation and device allocations are the first run's);
    before_label, after_label: the allocators of the before and after rows."""
    bs = [load(f) for f in before]
    as_ = [load(f) for f in after]
    out = ["| trace | frag before | frag after | device allocs after i4, before | after "
           "| driver us/iter before | after | ns/op before | after |",
           "|---|---|---|---|---|---|---|---|---|"]
    for trace in sorted(as_[0]):
        xs = [b.get(trace, {}).get(before_label) for b in bs]
        ys = [a.get(trace, {}).get(after_label) for a in as_]
        if not all(xs) or not all(ys):
            continue
        both = lambda rows, key: " / ".join(f"{r[key]:.0f}" for r in rows)
        x, y = xs[0], ys[0]
        out.append(f"| {trace} | {100*x['fragmentation']:.2f}% | {100*y['fragmentation']:.2f}% "
                   f"| {x['device_allocs_after_4']} | {y['device_allocs_after_4']} "
                   f"| {both(xs, 'driver_us_per_iter_after_4')} | {both(ys, 'driver_us_per_iter_after_4')} "
                   f"| {both(xs, 'ns_per_op_after_4')} | {both(ys, 'ns_per_op_after_4')} |")
    return f"### {title}\n\n{text}\n" + "\n".join(out) + "\n\n"


def into(path, section):
    begin, end = "<!-- h200 -->", "<!-- /h200 -->"
    text = open(path).read() if os.path.exists(path) else ""
    block = begin + "\n" + section + end
    if begin in text and end in text:
        text = text[:text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(text)


def comparisons(main_run):
    out = ""
    def paths(runs):
        return tuple(os.path.join(RESULTS, f) for f in (runs if isinstance(runs, tuple) else (runs,)))

    for title, text, before, after, *label in COMPARISONS:
        b = paths(before)
        a = (main_run,) if after is None else paths(after)
        if all(os.path.exists(f) for f in b + a):
            out += before_after(title, text, b, a, *label)
    return out


def main(argv):
    if len(argv) == 3 and argv[1] == "--into":
        into(argv[2], HEADER + table(argv[0]) + "\n" + tables() + comparisons(argv[0]))
    elif len(argv) == 1:
        sys.stdout.write(table(argv[0]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
