#!/usr/bin/env python3
"""summarize_dist.py DIR - markdown tables from the JSONs train_dist.py wrote under DIR.

Writes DIR/dist_summary.md (and prints it): per mode (ddp, fsdp) x allocator x rank,
peak reserved (device view and the allocator's own), peak allocated, tokens/s and %
of default's (same mode and rank), losses identical to default's (the all-reduced
mean and the rank's own, bit for bit), parameter checksum after training identical
to default's; then whether gmlake reserves no more than the best peer, per mode and
rank; then failed and skipped runs (DIR/skipped.txt). Needs no torch.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from summarize import ALLOCATORS, PEERS, failures, gb, loss_compare, peer_verdict  # noqa: E402
from summarize import load as load_runs  # noqa: E402

SCHEMA = "gmlake-torch-dist/1"
MODES = ["ddp", "fsdp"]


def load(dirpath):
    return load_runs(dirpath, "dist.*.json", SCHEMA)


def local_view(r):
    """r with its per-rank losses in the fields loss_compare reads."""
    return {"losses": r.get("local_losses"), "losses_hex": r.get("local_losses_hex")}


def mode_table(mode, runs, lines, verdicts):
    rs = [r for r in runs if r.get("mode") == mode]
    if not rs:
        return
    ranks = sorted({r.get("rank", 0) for r in rs})
    any_r = rs[0]
    w = any_r.get("wrap") or {}
    lines.append(f"### {mode}")
    lines.append("")
    lines.append(f"{any_r.get('model')} ({(any_r.get('model_spec') or {}).get('layers')} layers, "
                 f"{(any_r.get('param_count') or 0) / 1e6:.0f} M params), world size {any_r.get('world_size')}, "
                 f"batch {any_r.get('batch')} per rank, {any_r.get('steps')} steps, seed {any_r.get('seed')}, "
                 f"{w.get('impl', mode)}"
                 f"{', ' + w['mixed_precision'] if w.get('mixed_precision') else ''}, "
                 f"activation checkpointing {'on' if any_r.get('ckpt') else 'off'}")
    lines.append("")
    lines.append("| allocator | rank | ok | peak reserved, device view (GB) | peak reserved, own (GB) "
                 "| peak allocated, own (GB) | tokens/s (rank) | % of default | losses = default (mean / rank) "
                 "| params = default | max abs diff |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for rank in ranks:
        by = {r["allocator"]: r for r in rs if r.get("rank", 0) == rank}
        ref = by.get("default") if by.get("default", {}).get("ok") else None
        ref_tps = ref.get("tokens_per_s") if ref else None
        for a in ALLOCATORS + sorted(set(by) - set(ALLOCATORS)):
            r = by.get(a)
            if r is None:
                lines.append(f"| {a} | {rank} | not run | | | | | | | | |")
                continue
            tps = r.get("tokens_per_s")
            pct = f"{100.0 * tps / ref_tps:.1f}%" if tps and ref_tps else "-"
            if a == "default":
                same, params, diff = "(reference)", "(reference)", None
            elif ref is None:
                same, params, diff = "no default", "no default", None
            else:
                s_mean, diff = loss_compare(r, ref)
                s_loc, d_loc = loss_compare(local_view(r), local_view(ref))
                same = f"{s_mean} / {s_loc}"
                if d_loc is not None:
                    diff = d_loc if diff is None else max(diff, d_loc)
                ph, rh = r.get("param_checksum_hex"), ref.get("param_checksum_hex")
                params = "-" if ph is None or rh is None else ("yes" if ph == rh else "NO")
            lines.append(
                f"| {a} | {rank} | {'yes' if r.get('ok') else 'NO'} | {gb(r.get('peak_reserved_device'))} "
                f"| {gb(r.get('peak_reserved_own'))} | {gb(r.get('peak_allocated_own'))} "
                f"| {f'{tps:,.0f}' if tps else '-'} | {pct} | {same} | {params} "
                f"| {'-' if diff is None else f'{diff:.3g}'} |")
        g = by.get("gmlake")
        peers = [by[p] for p in PEERS if p in by and by[p].get("ok")]
        tag = f"{mode} rank {rank}"
        if g is None or not g.get("ok"):
            verdicts.append(f"- {tag}: gmlake did not complete a run, no verdict")
            continue
        if not peers:
            verdicts.append(f"- {tag}: no peer completed a run, no verdict")
            continue
        missing = [p for p in PEERS if p not in by or not by[p].get("ok")]
        verdicts.append(f"- {tag}: gmlake <= best peer? " + peer_verdict(g, peers)
                        + (f" (peers missing: {', '.join(missing)})" if missing else ""))
    lines.append("")


def summarize(dirpath):
    runs = load(dirpath)
    lines = ["# gmlake with several GPUs (DDP, FSDP): measured", ""]
    if runs:
        r0 = runs[0]
        lines.append(f"GPU {r0.get('gpu')}, torch {r0.get('torch')} (CUDA {r0.get('cuda')}, NCCL "
                     f"{r0.get('nccl_version')}), transformers "
                     f"{next((r.get('transformers') for r in runs if r.get('transformers')), '?')}, "
                     f"Python {r0.get('python')}. {len(runs)} rank JSONs; world sizes "
                     f"{sorted({r.get('world_size') for r in runs})}.")
        lines.append("")
        lines.append("Per rank. Peak reserved, device view: max over samples of (total - free) from "
                     "torch.cuda.mem_get_info() on the rank's GPU after every forward, backward and optimizer "
                     "step, minus the value after NCCL init (before the model): the same measure for every "
                     "allocator; NCCL's own buffers made later (lazy connections) count in it for all. Own "
                     "view: the allocator's reserved_bytes.all.peak. GB = 1e9 bytes. tokens/s: this rank's "
                     "tokens over its step time, first 3 steps left out. Losses: the all-reduced mean and "
                     "the rank's own, bit for bit against the default allocator's (same mode, same rank); "
                     "params: a float64 sum of the rank's parameters (its shards under FSDP) after training.")
        lines.append("")
    else:
        lines.append(f"No train_dist.py JSONs found under {dirpath}.")
        lines.append("")
    lines.append("## Training runs")
    lines.append("")
    verdicts = []
    for m in MODES + sorted({r.get("mode") for r in runs} - set(MODES)):
        mode_table(m, runs, lines, verdicts)
    if verdicts:
        lines.append("### gmlake against the best peer (peak reserved)")
        lines.append("")
        lines.extend(verdicts)
        lines.append("")
    failures(runs, dirpath, lines)
    return "\n".join(lines) + "\n"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print("usage: summarize_dist.py DIR   (writes DIR/dist_summary.md)")
        return 2
    d = argv[0]
    text = summarize(d)
    with open(os.path.join(d, "dist_summary.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
