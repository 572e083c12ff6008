#!/usr/bin/env python3
"""summarize.py DIR - markdown tables from the JSONs that train.py wrote under DIR.

Writes DIR/summary.md (and prints it):
  - per model x allocator: peak reserved (device view and the allocator's own),
    peak allocated, tokens/s and % of default, losses identical to default's;
  - whether gmlake reserves no more than the best peer, per model;
  - the out-of-memory cap experiment (largest batch per allocator);
  - the captured traces (validated again here);
  - failed and skipped runs.
Needs no torch.
"""

import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMA = "gmlake-torch-run/1"
ALLOCATORS = ["default", "expandable", "cudamallocasync", "gmlake"]
PEERS = ["default", "expandable", "cudamallocasync"]
MODEL_ORDER = ["gpt2-dynseq", "opt1.3b-ckpt", "llama1b-lora-ckpt", "gpt2s-dynseq", "llama-small-lora-ckpt"]


def gb(x, nd=2):
    return "-" if x is None else f"{x / 1e9:.{nd}f}"


def load(dirpath, pattern="*.json", schema=SCHEMA):
    """Every JSON under dirpath (recursively) named like pattern with this schema."""
    runs = []
    for p in sorted(glob.glob(os.path.join(dirpath, "**", pattern), recursive=True)):
        try:
            with open(p) as f:
                r = json.load(f)
        except Exception as e:
            print(f"summarize: skipping {p}: {e}", file=sys.stderr)
            continue
        if isinstance(r, dict) and r.get("schema") == schema:
            r["_path"] = os.path.relpath(p, dirpath)
            runs.append(r)
    return runs


def order_key(model):
    return (MODEL_ORDER.index(model) if model in MODEL_ORDER else len(MODEL_ORDER), model)


def loss_compare(r, ref):
    """(text, max abs diff) comparing r's losses with ref's, step by step."""
    if ref is None or not ref.get("losses"):
        return "no default", None
    a, b = r.get("losses") or [], ref.get("losses") or []
    ha, hb = r.get("losses_hex") or [], ref.get("losses_hex") or []
    n = min(len(a), len(b))
    if n == 0:
        return "no losses", None
    diff = max(abs(x - y) for x, y in zip(a[:n], b[:n]))
    same = all(x == y for x, y in zip(ha[:n], hb[:n])) if len(ha) >= n and len(hb) >= n else diff == 0
    text = "yes" if same else "no"
    if len(a) != len(b):
        text += f" ({n} of {max(len(a), len(b))} steps)"
    return text, diff


def peer_verdict(g, peers):
    """Whether run g's peak reserved (device view and own view) is at or below the
    lowest of the peer runs', with both figures."""
    parts = []
    for key, label in (("peak_reserved_device", "device view"), ("peak_reserved_own", "own view")):
        pv = [(p.get(key), p["allocator"]) for p in peers if p.get(key) is not None]
        gv = g.get(key)
        if gv is None or not pv:
            parts.append(f"{label}: n/a")
            continue
        best, who = min(pv)
        rel = f", {100.0 * (gv - best) / best:+.1f}%" if best else ""
        parts.append(f"{label}: {'yes' if gv <= best else 'NO'} (gmlake {gb(gv)} GB vs best peer {who} "
                     f"{gb(best)} GB{rel})")
    return "; ".join(parts)


def model_tables(runs, lines):
    # untagged runs, and tagged ones other than throughput rounds (e.g. "compiled")
    train = [r for r in runs if r.get("kind") == "train" and not str(r.get("tag") or "").startswith("round")]
    models = sorted({(r["model"], r.get("tag") or "") for r in train}, key=lambda mt: (order_key(mt[0]), mt[1]))
    verdicts = []
    for m, tag in models:
        by = {r["allocator"]: r for r in train if r["model"] == m and (r.get("tag") or "") == tag}
        ref = by.get("default") if by.get("default", {}).get("ok") else None
        any_r = next(iter(by.values()))
        if tag:
            m = f"{m} ({tag}{', torch.compile ' + any_r['compile'] if any_r.get('compile') else ''})"
        lines.append(f"### {m}")
        lines.append("")
        lines.append(f"batch {any_r.get('batch')}, {any_r.get('steps')} steps, seed {any_r.get('seed')}, "
                     f"attention {any_r.get('attn_implementation')}, "
                     f"{(any_r.get('param_count') or 0) / 1e6:.0f} M params "
                     f"({(any_r.get('trainable_params') or 0) / 1e6:.1f} M trainable)")
        lines.append("")
        lines.append("| allocator | ok | peak reserved, device view (GB) | peak reserved, own (GB) "
                     "| peak allocated, own (GB) | tokens/s | % of default | losses = default | max abs diff |")
        lines.append("|---|---|---|---|---|---|---|---|---|")
        ref_tps = ref.get("tokens_per_s") if ref else None
        for a in ALLOCATORS + sorted(set(by) - set(ALLOCATORS)):
            r = by.get(a)
            if r is None:
                lines.append(f"| {a} | not run | | | | | | | |")
                continue
            tps = r.get("tokens_per_s")
            pct = f"{100.0 * tps / ref_tps:.1f}%" if tps and ref_tps else "-"
            if a == "default":
                same, diff = ("(reference)", None)
            else:
                same, diff = loss_compare(r, ref)
            lines.append(
                f"| {a} | {'yes' if r.get('ok') else 'NO'} | {gb(r.get('peak_reserved_device'))} "
                f"| {gb(r.get('peak_reserved_own'))} | {gb(r.get('peak_allocated_own'))} "
                f"| {f'{tps:,.0f}' if tps else '-'} | {pct} | {same} "
                f"| {'-' if diff is None else f'{diff:.3g}'} |")
        lines.append("")
        g = by.get("gmlake")
        peers = [by[p] for p in PEERS if p in by and by[p].get("ok")]
        if g is None or not g.get("ok"):
            verdicts.append(f"- {m}: gmlake did not complete a run, no verdict")
        elif not peers:
            verdicts.append(f"- {m}: no peer completed a run, no verdict")
        else:
            verdicts.append(f"- {m}: gmlake <= best peer? " + peer_verdict(g, peers))
    if verdicts:
        lines.append("### gmlake against the best peer (peak reserved)")
        lines.append("")
        lines.extend(verdicts)
        lines.append("")


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return None if n == 0 else (xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2)


def rounds_table(runs, lines):
    """Throughput rounds (run_gpu.sh ROUNDS): each allocator's tokens/s as a % of the
    default's in the same round, and the median over rounds."""
    rr = [r for r in runs if r.get("kind") == "train" and str(r.get("tag") or "").startswith("round")]
    if not rr:
        return
    lines.append("## Throughput rounds")
    lines.append("")
    lines.append("Each round runs every allocator once (order rotated per round); % of default is "
                 "against the default's run of the same round; the verdict uses the median over rounds.")
    lines.append("")
    for m in sorted({r["model"] for r in rr}, key=order_key):
        rounds = sorted({r["tag"] for r in rr if r["model"] == m}, key=lambda t: (len(t), t))
        by = {(r["tag"], r["allocator"]): r for r in rr if r["model"] == m and r.get("ok")}
        lines.append(f"### {m}: {len(rounds)} rounds")
        lines.append("")
        lines.append("| allocator | " + " | ".join(rounds) + " | median % of default | min | max |")
        lines.append("|---|" + "---|" * (len(rounds) + 3))
        for a in ALLOCATORS:
            cells, pcts = [], []
            for t in rounds:
                r, ref = by.get((t, a)), by.get((t, "default"))
                tps = r.get("tokens_per_s") if r else None
                ref_tps = ref.get("tokens_per_s") if ref else None
                if tps and ref_tps:
                    pcts.append(100.0 * tps / ref_tps)
                    cells.append(f"{tps:,.0f} ({pcts[-1]:.1f}%)")
                else:
                    cells.append(f"{tps:,.0f}" if tps else "-")
            med = median(pcts)
            lines.append(f"| {a} | " + " | ".join(cells) + " | "
                         + ("-" if med is None else f"{med:.1f}%") + " | "
                         + (f"{min(pcts):.1f}% | {max(pcts):.1f}% |" if pcts else "- | - |"))
        g = [100.0 * by[(t, "gmlake")]["tokens_per_s"] / by[(t, "default")]["tokens_per_s"]
             for t in rounds if (t, "gmlake") in by and (t, "default") in by
             and by[(t, "gmlake")].get("tokens_per_s") and by[(t, "default")].get("tokens_per_s")]
        lines.append("")
        lines.append("| allocator | peak reserved GB (device view) per round | median | losses equal default's |")
        lines.append("|---|---|---|---|")
        for a in ALLOCATORS:
            peaks = [by[(t, a)].get("peak_reserved_device") for t in rounds if (t, a) in by]
            peaks = [p for p in peaks if p]
            same = [by[(t, a)].get("losses") == by[(t, "default")].get("losses")
                    for t in rounds if (t, a) in by and (t, "default") in by]
            lines.append(f"| {a} | " + ", ".join(gb(p) for p in peaks) + " | "
                         + (gb(median(peaks)) if peaks else "-") + " | "
                         + (("yes" if all(same) else "NO") if same else "-") + " |")
        lines.append("")
        if g:
            lines.append(f"- {m}: gmlake median {median(g):.2f}% of default over {len(g)} rounds "
                         f"(min {min(g):.2f}%, max {max(g):.2f}%)")
        else:
            lines.append(f"- {m}: no round with both gmlake and default, no verdict")
        lines.append("")


def oom_table(runs, lines):
    mb = [r for r in runs if r.get("kind") == "maxbatch"]
    if not mb:
        return
    lines.append("## Largest batch under a memory cap")
    lines.append("")
    for m in sorted({r["model"] for r in mb}, key=order_key):
        rs = {r["allocator"]: r for r in mb if r["model"] == m}
        any_r = next(iter(rs.values()))
        lines.append(f"{m}, cap {gb(any_r.get('limit_bytes'))} GB (PyTorch allocators: "
                     "set_per_process_memory_fraction(cap/total); gmlake: its own limit), "
                     f"{any_r.get('steps')} steps per batch size, batch sizes {any_r.get('batch_sizes')}")
        lines.append("")
        lines.append("Note: PyTorch's cudaMallocAsync backend applies the fraction to the bytes in use "
                     "(pytorch_used_bytes), not to what its pool reserves, so its cap is looser than the "
                     "others'; its device-view column shows what it really held.")
        lines.append("")
        lines.append("| allocator | max batch trained | first OOM at | device view at max batch (GB) "
                     "| own reserved at max batch (GB) | batches tried | note |")
        lines.append("|---|---|---|---|---|---|---|")
        for a in ALLOCATORS + sorted(set(rs) - set(ALLOCATORS)):
            r = rs.get(a)
            if r is None:
                lines.append(f"| {a} | not run | | | | | |")
                continue
            bs = r.get("batches") or []
            last_ok = next((b for b in reversed(bs) if b.get("ok")), None)
            tried = ", ".join(f"{b['batch']}{'' if b.get('ok') else (' OOM' if b.get('oom') else ' failed')}"
                              for b in bs)
            note = ""
            if r.get("error"):
                note = r["error"].splitlines()[0][:120]
            elif r.get("all_fit"):
                note = "every size fit"
            lines.append(f"| {a} | {r.get('max_batch') if r.get('max_batch') is not None else '-'} "
                         f"| {r.get('first_oom_batch') if r.get('first_oom_batch') is not None else '-'} "
                         f"| {gb(last_ok.get('peak_reserved_device')) if last_ok else '-'} "
                         f"| {gb(last_ok.get('peak_reserved_own')) if last_ok else '-'} | {tried} | {note} |")
        lines.append("")


def trace_table(runs, dirpath, lines):
    caps = [r for r in runs if r.get("kind") == "capture"]
    files = sorted(glob.glob(os.path.join(dirpath, "**", "*.trace.gz"), recursive=True))
    if not caps and not files:
        return
    sys.path.insert(0, HERE)
    try:
        import capture_trace
    except Exception:
        capture_trace = None
    lines.append("## Captured traces")
    lines.append("")
    lines.append("| trace | allocs | frees | iterations | live at end | peak live (GB) | torch peak reserved (GB) "
                 "| valid |")
    lines.append("|---|---|---|---|---|---|---|---|")
    seen = set()
    for p in files:
        seen.add(os.path.abspath(p))
        if capture_trace is None:
            lines.append(f"| {os.path.relpath(p, dirpath)} | ? | ? | ? | ? | ? | ? | ? |")
            continue
        v = capture_trace.validate(p)
        tpr = v["meta"].get("torch_peak_reserved")
        lines.append(f"| {os.path.relpath(p, dirpath)} | {v['allocs']} | {v['frees']} | {v['iterations']} "
                     f"| {v['live_at_end']} | {gb(v['peak_live_bytes'])} "
                     f"| {gb(int(tpr)) if tpr and tpr.isdigit() else '-'} "
                     f"| {'yes' if v['ok'] else 'NO: ' + '; '.join(v['errors'][:2])} |")
    for r in caps:
        c = r.get("capture") or {}
        if c.get("path") and os.path.abspath(c["path"]) in seen:
            continue
        lines.append(f"| {r['model']} (capture run{'' if r.get('ok') else ' FAILED'}) | {c.get('allocs', '-')} "
                     f"| {c.get('frees', '-')} | {c.get('iterations', '-')} | {c.get('live_at_end', '-')} | - | - "
                     f"| {(c.get('validate') or {}).get('ok', '-')} |")
    lines.append("")


def failures(runs, dirpath, lines):
    bad = [r for r in runs if not r.get("ok")]
    skipped = os.path.join(dirpath, "skipped.txt")
    extra = open(skipped).read().strip() if os.path.exists(skipped) else ""
    if not bad and not extra:
        return
    lines.append("## Failed or skipped")
    lines.append("")
    for r in bad:
        err = (r.get("error") or "no error recorded (killed?)").splitlines()[0][:300]
        lines.append(f"- `{r['_path']}`: failed during {r.get('phase')}: {err}")
    for line in extra.splitlines():
        lines.append(f"- {line}")
    lines.append("")


def summarize(dirpath):
    runs = load(dirpath)
    lines = ["# gmlake in PyTorch training: measured", ""]
    if runs:
        r0 = runs[0]
        lines.append(f"GPU {r0.get('gpu')}, torch {r0.get('torch')} (CUDA {r0.get('cuda')}), "
                     f"transformers {next((r.get('transformers') for r in runs if r.get('transformers')), '?')}, "
                     f"peft {next((r.get('peft') for r in runs if r.get('peft')), '?')}, "
                     f"Python {r0.get('python')}. {len(runs)} runs.")
        lines.append("")
        lines.append("Peak reserved, device view: max over samples of (total - free) from "
                     "torch.cuda.mem_get_info() after every forward, backward and optimizer step, minus "
                     "the value at start (after CUDA init, before the model): the same measure for every "
                     "allocator. Own view: the allocator's reserved_bytes.all.peak (torch.cuda.memory_stats(),"
                     " gmlake_torch.memory_stats()). GB = 1e9 bytes. tokens/s leaves out the first "
                     "3 steps. Losses are compared bit for bit with the default allocator's, step by step.")
        lines.append("")
    else:
        lines.append(f"No run JSONs found under {dirpath}.")
        lines.append("")
    lines.append("## Training runs")
    lines.append("")
    model_tables(runs, lines)
    rounds_table(runs, lines)
    oom_table(runs, lines)
    trace_table(runs, dirpath, lines)
    failures(runs, dirpath, lines)
    return "\n".join(lines) + "\n"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print("usage: summarize.py DIR   (writes DIR/summary.md)")
        return 2
    d = argv[0]
    text = summarize(d)
    out = os.path.join(d, "summary.md")
    with open(out, "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
