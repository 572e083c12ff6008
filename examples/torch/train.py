#!/usr/bin/env python3
"""train.py - one end-to-end training run with a chosen CUDA allocator.

    python3 train.py --model {gpt2-dynseq,opt1.3b-ckpt,llama1b-lora-ckpt,...}
                     --allocator {default,expandable,cudamallocasync,gmlake}
                     --steps N [--batch B] --out DIR [--limit BYTES]
                     [--find-max-batch B1,B2,...] [--capture PATH]

One run per process: PyTorch picks its allocator once, when CUDA starts.
  default          PyTorch's caching allocator (PYTORCH_CUDA_ALLOC_CONF unset)
  expandable       PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  cudamallocasync  PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
  gmlake           gmlake_torch.enable() (libgmlake_torch.so) before any CUDA work
The environment is set here before torch is imported (PYTORCH_ALLOC_CONF, the
newer name, gets the same value).

Models are built from transformers configs with random weights (nothing is
downloaded), trained with AdamW under bf16 autocast, eager attention, dropout 0,
a fixed seed, synthetic tokens from a CPU torch.Generator, and
torch.use_deterministic_algorithms(True, warn_only=True): losses should be
bit-identical across allocators (warnings about ops without a deterministic
kernel are kept in the JSON).

Memory is measured the same way for every allocator ("device view"): used =
total - free from torch.cuda.mem_get_info(), sampled at the start (after CUDA
init, before the model) and after every forward, backward and optimizer step
and at the end; peak_reserved_device = max(used) - used at start. Each
allocator's own figures are kept too (torch.cuda.memory_stats(), or
gmlake_torch.memory_stats()). Caching allocators only grow between samples, so
the sampled maximum is the peak; a run that releases memory mid-phase would be
under-counted by the device view (none of the four does in these jobs).

Writes DIR/<model>.<allocator>.json (.maxbatch.json for --find-max-batch,
.capture.json for --capture), also while it runs, so a killed run leaves what
it had. Exit status 0 when the run succeeded.
"""

import argparse
import gc
import json
import os
import platform
import random
import signal
import sys
import time
import traceback
import warnings

T_PROCESS = time.time()
HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

SCHEMA = "gmlake-torch-run/1"
ALLOC_CONF = {
    "default": "",
    "expandable": "expandable_segments:True",
    "cudamallocasync": "backend:cudaMallocAsync",
    "gmlake": "",
}
ATTN = "eager"  # deterministic forward and backward, in every transformers version
WARMUP = 3      # steps left out of tokens/s

# Model shapes. seq: (lo, hi) sequence length drawn per step (lo == hi: fixed).
MODELS = {
    # GPT-2 medium, full fine-tune, sequence length random per step
    "gpt2-dynseq": dict(family="gpt2", layers=24, hidden=1024, heads=16, vocab=50257,
                        seq=(64, 1024), batch=16, ckpt=False, lora=False, bf16_weights=False),
    # OPT-1.3B shape with activation checkpointing
    "opt1.3b-ckpt": dict(family="opt", layers=24, hidden=2048, ffn=8192, heads=32, vocab=50272,
                         seq=(1024, 1024), batch=8, ckpt=True, lora=False, bf16_weights=False),
    # TinyLlama shape, bf16 weights, LoRA r=16 on q/k/v/o, checkpointing
    "llama1b-lora-ckpt": dict(family="llama", layers=22, hidden=2048, ffn=5632, heads=32, kv_heads=4,
                              vocab=32000, seq=(128, 2048), batch=8, ckpt=True, lora=True,
                              bf16_weights=True),
    # small ones, for quick trace captures
    "gpt2s-dynseq": dict(family="gpt2", layers=12, hidden=768, heads=12, vocab=50257,
                         seq=(64, 1024), batch=8, ckpt=False, lora=False, bf16_weights=False),
    "llama-small-lora-ckpt": dict(family="llama", layers=8, hidden=1024, ffn=2816, heads=16, kv_heads=4,
                                  vocab=32000, seq=(128, 2048), batch=8, ckpt=True, lora=True,
                                  bf16_weights=True),
    # TinyLlama shape, bf16 weights, full fine-tune; batch size and sequence length both
    # drawn per step (batch_range: (lo, hi)), so the activations' shapes change every step
    "llama1b-dynbatch": dict(family="llama", layers=22, hidden=2048, ffn=5632, heads=32, kv_heads=4,
                             vocab=32000, seq=(128, 1024), batch=8, batch_range=(2, 16), ckpt=False,
                             lora=False, bf16_weights=True),
    # Llama-3.2-3B shape (GQA 24/8, 128k vocabulary), bf16 weights, full fine-tune; batch
    # size and sequence length drawn per step
    "llama3b-dynbatch": dict(family="llama", layers=28, hidden=3072, ffn=8192, heads=24, kv_heads=8,
                             vocab=128256, seq=(128, 1024), batch=4, batch_range=(1, 8), ckpt=False,
                             lora=False, bf16_weights=True),
    # a small Mixtral-shape mixture of experts (8 experts, top 2), bf16 weights, full
    # fine-tune, sequence length drawn per step: the tokens each expert gets change
    # every step
    "moe-small-dynseq": dict(family="mixtral", layers=8, hidden=1024, ffn=2816, heads=16, kv_heads=4,
                             vocab=32000, experts=8, top_k=2, seq=(128, 2048), batch=8, ckpt=False,
                             lora=False, bf16_weights=True),
    # GPT-2 small with a fixed shape: the torch.compile(mode="reduce-overhead") run
    "gpt2s-fixed": dict(family="gpt2", layers=12, hidden=768, heads=12, vocab=50257,
                        seq=(512, 512), batch=8, ckpt=False, lora=False, bf16_weights=False),
}

R = {}          # the result, written as JSON
OUT_PATH = None


def save():
    """Writes R to OUT_PATH atomically (never raises)."""
    if not OUT_PATH:
        return
    try:
        R["wall_s"] = round(time.time() - T_PROCESS, 3)
        tmp = OUT_PATH + ".tmp"
        with open(tmp, "w") as f:
            json.dump(R, f, indent=1, default=str)
        os.replace(tmp, OUT_PATH)
    except Exception as e:
        print(f"train.py: cannot write {OUT_PATH}: {e}", file=sys.stderr)


def log(msg):
    print(f"[{time.time() - T_PROCESS:7.1f}s] {msg}", flush=True)


def finish(code):
    save()
    sys.stdout.flush()
    sys.stderr.flush()
    # skip interpreter teardown: a broken CUDA context (after an out-of-memory
    # null pointer, say) can hang or crash in destructors, and it saves time
    os._exit(code)


def on_signal(signum, frame):
    R["ok"] = False
    if not R.get("error"):
        R["error"] = f"killed by signal {signum} (timeout?) during {R.get('phase', '?')}"
    log(R["error"])
    finish(124)


def set_alloc_env(allocator):
    conf = ALLOC_CONF[allocator]
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        if conf:
            os.environ[var] = conf
        else:
            os.environ.pop(var, None)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                 ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ.setdefault(k, v)


class DeviceMemory:
    """Device-wide used bytes (total - free), the same measure for every allocator."""

    def __init__(self, torch):
        self.torch = torch
        free, total = torch.cuda.mem_get_info()
        self.total = int(total)
        self.start = int(total - free)
        self.peak = self.start
        self.samples = 1

    def sample(self):
        free, total = self.torch.cuda.mem_get_info()
        used = int(total - free)
        self.samples += 1
        if used > self.peak:
            self.peak = used
        return used

    def reset_peak(self):
        """Peak := current (the start stays)."""
        self.peak = self.start
        self.peak = max(self.start, self.sample())


def parse_args(argv):
    ap = argparse.ArgumentParser(description="One training run with a chosen CUDA allocator.")
    ap.add_argument("--model", required=True, choices=sorted(MODELS))
    ap.add_argument("--allocator", required=True, choices=list(ALLOC_CONF))
    ap.add_argument("--steps", type=int, default=10,
                    help="training steps (with --find-max-batch: steps per batch size)")
    ap.add_argument("--batch", type=int, default=0, help="batch size (default: the model's)")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--limit", type=int, default=0,
                    help="cap in bytes: set_per_process_memory_fraction(limit/total) for the PyTorch "
                         "allocators, gmlake_torch.enable(limit=...) for gmlake")
    ap.add_argument("--find-max-batch", default="",
                    help="comma list of batch sizes: train --steps steps with each, in increasing "
                         "order, until the first out-of-memory")
    ap.add_argument("--capture", default="", help="record a trace (.trace.gz) of the run "
                                                  "(default allocator only)")
    ap.add_argument("--gmlake-lib", default="", help="path of libgmlake_torch.so")
    ap.add_argument("--tag", default="", help="suffix for the JSON name")
    ap.add_argument("--compile", default="", help="torch.compile mode for the model (e.g. reduce-overhead, "
                                                  "which replays CUDA graphs); empty: eager")
    return ap.parse_args(argv)


def build_model(name, spec, torch, R):
    import transformers
    from transformers import AutoModelForCausalLM

    R["transformers"] = transformers.__version__
    fam = spec["family"]
    if fam == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=spec["vocab"], n_positions=1024, n_embd=spec["hidden"],
                                      n_layer=spec["layers"], n_head=spec["heads"], resid_pdrop=0.0,
                                      embd_pdrop=0.0, attn_pdrop=0.0)
    elif fam == "opt":
        cfg = transformers.OPTConfig(vocab_size=spec["vocab"], hidden_size=spec["hidden"],
                                     num_hidden_layers=spec["layers"], ffn_dim=spec["ffn"],
                                     num_attention_heads=spec["heads"], max_position_embeddings=2048,
                                     word_embed_proj_dim=spec["hidden"], do_layer_norm_before=True,
                                     dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                                     layerdrop=0.0)
    elif fam == "llama":
        cfg = transformers.LlamaConfig(vocab_size=spec["vocab"], hidden_size=spec["hidden"],
                                       intermediate_size=spec["ffn"], num_hidden_layers=spec["layers"],
                                       num_attention_heads=spec["heads"],
                                       num_key_value_heads=spec["kv_heads"], max_position_embeddings=2048,
                                       rms_norm_eps=1e-5, tie_word_embeddings=False, attention_dropout=0.0)
    elif fam == "mixtral":
        cfg = transformers.MixtralConfig(vocab_size=spec["vocab"], hidden_size=spec["hidden"],
                                         intermediate_size=spec["ffn"], num_hidden_layers=spec["layers"],
                                         num_attention_heads=spec["heads"],
                                         num_key_value_heads=spec["kv_heads"], max_position_embeddings=4096,
                                         num_local_experts=spec["experts"],
                                         num_experts_per_tok=spec["top_k"], rms_norm_eps=1e-5,
                                         tie_word_embeddings=False, attention_dropout=0.0)
    else:
        raise ValueError(fam)
    cfg.use_cache = False
    dtype = torch.bfloat16 if spec["bf16_weights"] else torch.float32
    notes = []
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # what from_config(dtype=...) does, on every version
    try:
        with torch.device("cuda"):  # initialize the weights on the GPU (fast; no CPU copy)
            # transformers >= 4.56 / 5.x take dtype=, older ones torch_dtype=; an
            # unknown keyword reaches the model's __init__ and raises TypeError there
            model = None
            for kw in ({"attn_implementation": ATTN, "dtype": dtype},
                       {"attn_implementation": ATTN, "torch_dtype": dtype}):
                try:
                    model = AutoModelForCausalLM.from_config(cfg, **kw)
                    break
                except TypeError as e:
                    notes.append(f"from_config({', '.join(kw)}) refused: {e}")
            if model is None:
                cfg._attn_implementation = ATTN
                model = AutoModelForCausalLM.from_config(cfg)
    finally:
        torch.set_default_dtype(prev)
    p0 = next(model.parameters())
    if p0.device.type != "cuda":
        notes.append(f"weights were built on {p0.device}; moved to cuda")
        model = model.to("cuda")
    if p0.dtype != dtype:
        notes.append(f"weights were built in {p0.dtype}; cast to {dtype}")
        model = model.to(dtype)
    R["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    if spec["ckpt"]:
        try:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        except TypeError:
            model.gradient_checkpointing_enable()
            notes.append("gradient_checkpointing_enable() without kwargs")
    if spec["lora"]:
        import peft
        from peft import LoraConfig, get_peft_model

        R["peft"] = peft.__version__
        lc = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        model = get_peft_model(model, lc)
    model.train()
    R["param_count"] = sum(p.numel() for p in model.parameters())
    R["trainable_params"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    R["weights_dtype"] = str(dtype)
    if notes:
        R["build_notes"] = notes
    return model


def make_batches(spec, steps, batch, seed, torch, batch_range=None):
    """Deterministic synthetic token batches (CPU): sequence length drawn per step from
    spec["seq"], the batch size from batch_range (lo, hi) when given, else `batch`."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    lo, hi = spec["seq"]
    out = []
    for _ in range(steps):
        s = lo if lo == hi else rng.randint(lo, hi)
        b = rng.randint(*batch_range) if batch_range else batch
        out.append(torch.randint(0, spec["vocab"], (b, s), generator=gen, dtype=torch.long))
    return out


def is_oom(e, torch, gm_ooms_before, gm):
    if isinstance(e, getattr(torch, "OutOfMemoryError", ())) or \
            isinstance(e, getattr(torch.cuda, "OutOfMemoryError", ())):
        return True
    if "out of memory" in str(e).lower():
        return True
    # the pluggable allocator path gives PyTorch a null pointer when gmlake is out of
    # memory; that surfaces later as some CUDA error. gmlake counted the failure.
    if gm is not None and gm_ooms() > gm_ooms_before:
        return True
    return False


_GM = None


def gm_ooms():
    if _GM is None:
        return 0
    try:
        return int(_GM.memory_stats().get("num_ooms", 0))
    except Exception:
        return 0


def own_stats(allocator, torch):
    try:
        if allocator == "gmlake":
            return dict(_GM.memory_stats())
        return {k: v for k, v in torch.cuda.memory_stats().items() if not isinstance(v, dict)}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def reset_own_peaks(allocator, torch):
    try:
        if allocator == "gmlake":
            _GM.reset_peak_memory_stats()
        else:
            torch.cuda.reset_peak_memory_stats()
    except Exception as e:
        log(f"reset peaks: {e}")


def empty_caches(allocator, torch):
    try:
        torch.cuda.synchronize()
        if allocator == "gmlake":
            _GM.empty_cache()
        else:
            torch.cuda.empty_cache()
    except Exception as e:
        log(f"empty cache: {e}")


def train_step(model, opt, ids_cpu, torch, mem, allocator):
    """One forward, backward and optimizer step on ids_cpu, sampling device memory
    after each. Returns (loss as a float, the loss tensor detached, seconds)."""
    ooms0 = gm_ooms()
    ids = ids_cpu.to("cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(input_ids=ids, labels=ids)
    loss = out.loss
    mem.sample()
    loss.backward()
    mem.sample()
    opt.step()
    opt.zero_grad(set_to_none=True)
    mem.sample()
    lv = float(loss.detach().float().item())  # synchronizes
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    if allocator == "gmlake" and gm_ooms() > ooms0:
        raise RuntimeError(f"gmlake returned NULL (num_ooms {ooms0} -> {gm_ooms()}): out of memory "
                           "(the pluggable path does not raise it)")
    return lv, loss.detach(), dt


def record_step(record, lv, dt, ids_cpu):
    """Appends one step's loss, time and shape to the lists in record."""
    record["losses"].append(lv)
    record["losses_hex"].append(lv.hex())
    record["step_seconds"].append(round(dt, 6))
    record["seq_lens"].append(int(ids_cpu.shape[1]))
    record["tokens"].append(int(ids_cpu.numel()))


def run_steps(model, opt, batches, torch, mem, rec=None, record=None, allocator=""):
    """Trains on batches; appends per-step figures to the lists in record."""
    for i, ids_cpu in enumerate(batches):
        if rec is not None:
            rec.iteration(i)
        R["phase"] = f"step {len(record['losses'])}"
        lv, _, dt = train_step(model, opt, ids_cpu, torch, mem, allocator)
        record_step(record, lv, dt, ids_cpu)
        log(f"step {len(record['losses']) - 1}: batch {ids_cpu.shape[0]} seq {ids_cpu.shape[1]} "
            f"loss {lv:.6f} {dt * 1000:.1f} ms, device used {(mem.peak - mem.start) / 1e9:.2f} GB peak")


def tokens_per_s(record):
    t = record["step_seconds"][WARMUP:]
    n = record["tokens"][WARMUP:]
    return (sum(n) / sum(t)) if t and sum(t) > 0 else None


def new_record():
    return {"losses": [], "losses_hex": [], "step_seconds": [], "seq_lens": [], "tokens": []}


def keep_determinism_warnings():
    """Keeps (up to 10 of) the warnings about ops without a deterministic kernel in
    R["determinism_warnings"], still showing every warning as usual."""
    kept = []
    show = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        s = f"{category.__name__}: {message}"
        if "determinis" in s.lower() and s not in kept and len(kept) < 10:
            kept.append(s[:500])
        show(message, category, filename, lineno, file, line)

    warnings.showwarning = showwarning
    R["determinism_warnings"] = kept


def main(argv=None):
    global OUT_PATH, _GM
    args = parse_args(sys.argv[1:] if argv is None else argv)
    spec = MODELS[args.model]
    batch = args.batch or spec["batch"]
    os.makedirs(args.out, exist_ok=True)
    kind = "maxbatch" if args.find_max_batch else ("capture" if args.capture else "train")
    suffix = {"train": "", "maxbatch": ".maxbatch", "capture": ".capture"}[kind]
    if args.tag:
        suffix += "." + args.tag
    OUT_PATH = os.path.join(args.out, f"{args.model}.{args.allocator}{suffix}.json")
    set_alloc_env(args.allocator)
    R.update({
        "schema": SCHEMA, "kind": kind, "model": args.model, "allocator": args.allocator, "tag": args.tag,
        "ok": False, "error": None, "phase": "start", "argv": [sys.executable] + sys.argv,
        "alloc_conf": ALLOC_CONF[args.allocator] or None,
        "env": {k: os.environ.get(k) for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF",
                                                "CUBLAS_WORKSPACE_CONFIG", "GMLAKE_TORCH_LIB",
                                                "GMLAKE_ALLOC_CONF", "CUDA_VISIBLE_DEVICES")},
        "python": platform.python_version(), "host": platform.node(),
        "seed": args.seed, "batch": batch, "steps": args.steps, "lr": args.lr,
        "limit_bytes": args.limit or None, "model_spec": spec, "warmup_steps": WARMUP,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
    })
    save()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    keep_determinism_warnings()

    torch = None
    rec = None
    mem = None
    try:
        R["phase"] = "import torch"
        t0 = time.time()
        import torch
        R["torch"] = torch.__version__
        R["cuda"] = torch.version.cuda
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda is not available")
        if args.allocator == "gmlake":
            R["phase"] = "gmlake enable"
            import gmlake_torch
            _GM = gmlake_torch
            R["gmlake_lib"] = gmlake_torch.enable(limit=args.limit or None, lib=args.gmlake_lib or None)
            log(f"gmlake enabled: {R['gmlake_lib']}" + (f", limit {args.limit} bytes" if args.limit else ""))
        R["phase"] = "cuda init"
        torch.manual_seed(args.seed)
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
        mem = DeviceMemory(torch)  # initializes CUDA
        R["gpu"] = torch.cuda.get_device_name()
        R["device_total_bytes"] = mem.total
        R["device_used_start"] = mem.start
        try:
            R["allocator_backend"] = torch.cuda.get_allocator_backend()
        except Exception:
            R["allocator_backend"] = None
        if args.allocator == "cudamallocasync" and R["allocator_backend"] != "cudaMallocAsync":
            raise RuntimeError(f"asked for cudaMallocAsync, PyTorch uses {R['allocator_backend']!r}")
        if args.limit and args.allocator != "gmlake":
            frac = min(1.0, args.limit / float(mem.total))
            torch.cuda.set_per_process_memory_fraction(frac)
            R["memory_fraction"] = frac
            log(f"memory fraction {frac:.4f} of {mem.total / 1e9:.1f} GB ({args.limit / 1e9:.2f} GB)")
        if args.capture:
            if args.allocator != "default":
                raise RuntimeError("--capture records PyTorch's caching-allocator history: "
                                   "use --allocator default")
            import capture_trace
            R["phase"] = "capture start"
            rec = capture_trace.TraceRecorder(args.capture, workload=args.model,
                                              meta={"job": f"train.py {' '.join(sys.argv[1:])}"})
            rec.start()
        R["import_s"] = round(time.time() - t0, 3)
        save()

        R["phase"] = "build model"
        t0 = time.time()
        torch.manual_seed(args.seed)
        model = build_model(args.model, spec, torch, R)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=args.lr)
        if args.compile:
            model = torch.compile(model, mode=args.compile)
            R["compile"] = args.compile
        torch.cuda.synchronize()
        mem.sample()
        R["build_s"] = round(time.time() - t0, 3)
        log(f"built {args.model}: {R['param_count'] / 1e6:.1f} M params, "
            f"{R['trainable_params'] / 1e6:.1f} M trainable, attention {R.get('attn_implementation')}, "
            f"{R['build_s']} s")
        save()

        t0 = time.time()
        if kind == "maxbatch":
            find_max(args, spec, model, opt, torch, mem)
        else:
            rec_lists = new_record()
            R.update(rec_lists)
            batches = make_batches(spec, args.steps, batch, args.seed, torch,
                                   None if args.batch else spec.get("batch_range"))
            run_steps(model, opt, batches, torch, mem, rec=rec, record=rec_lists, allocator=args.allocator)
            R["tokens_per_s"] = tokens_per_s(rec_lists)
            R["ok"] = True
        R["train_s"] = round(time.time() - t0, 3)
        R["phase"] = "done"
    except BaseException as e:  # noqa: B902 - record everything, then exit
        R["ok"] = False
        R["error"] = f"{type(e).__name__}: {e}"[:4000]
        R["traceback"] = traceback.format_exc()[-8000:]
        if torch is not None and is_oom(e, torch, 0, _GM):
            R["oom"] = True
        log(f"FAILED during {R.get('phase')}: {R['error']}")
    finally:
        collect_end(args, torch, mem, rec)
    finish(0 if R.get("ok") else 1)


def collect_end(args, torch, mem, rec):
    if torch is None:
        return
    try:
        if rec is not None:
            R["phase_end"] = "capture stop"
            info = rec.stop(complete=bool(R.get("ok")))
            R["capture"] = info
            if info:
                v = info.get("validate", {})
                log(f"trace {info.get('path')}: {info.get('allocs')} allocs, {info.get('iterations')} "
                    f"iterations, valid {v.get('ok')} {v.get('errors', [])[:3]}")
    except Exception as e:
        R["capture_error"] = f"{type(e).__name__}: {e}"
        log(f"capture failed: {R['capture_error']}")
    if mem is not None:
        try:
            torch.cuda.synchronize()
            mem.sample()
        except Exception as e:
            R["end_sample_error"] = f"{type(e).__name__}: {e}"[:500]
        R["device_used_peak"] = mem.peak
        R["device_samples"] = mem.samples
        R["peak_reserved_device"] = mem.peak - mem.start
    st = own_stats(args.allocator, torch)
    R["own_stats"] = st
    R["peak_reserved_own"] = st.get("reserved_bytes.all.peak")
    R["peak_allocated_own"] = st.get("allocated_bytes.all.peak")
    R["peak_requested_own"] = st.get("requested_bytes.all.peak")
    R["num_alloc_retries"] = st.get("num_alloc_retries")
    R["num_ooms"] = st.get("num_ooms")
    if R.get("ok"):
        log(f"done: peak reserved device {R.get('peak_reserved_device', 0) / 1e9:.3f} GB, own "
            f"{(R['peak_reserved_own'] or 0) / 1e9:.3f} GB, allocated {(R['peak_allocated_own'] or 0) / 1e9:.3f}"
            f" GB, tokens/s {R.get('tokens_per_s')}")


def find_max(args, spec, model, opt, torch, mem):
    """Trains args.steps steps at each batch size in increasing order until the
    first out-of-memory; caches are emptied and peaks reset between sizes."""
    sizes = sorted({int(x) for x in args.find_max_batch.split(",") if x.strip()})
    R["batch_sizes"] = sizes
    R["batches"] = []
    R["max_batch"] = None
    R["first_oom_batch"] = None
    for b in sizes:
        entry = {"batch": b, "ok": False, "oom": False}
        R["batches"].append(entry)
        record = new_record()
        entry["record"] = record
        gc.collect()
        empty_caches(args.allocator, torch)
        reset_own_peaks(args.allocator, torch)
        ooms0 = gm_ooms()
        t0 = time.time()
        try:
            mem.reset_peak()
            batches = make_batches(spec, args.steps, b, args.seed, torch)
            run_steps(model, opt, batches, torch, mem, record=record, allocator=args.allocator)
            entry["ok"] = True
            R["max_batch"] = b
        except Exception as e:
            entry["error"] = f"{type(e).__name__}: {e}"[:2000]
            entry["oom"] = is_oom(e, torch, ooms0, _GM)
            log(f"batch {b}: {'OUT OF MEMORY' if entry['oom'] else 'FAILED'}: {entry['error'][:300]}")
            if entry["oom"]:
                R["first_oom_batch"] = b
            else:
                R["error"] = f"batch {b}: {entry['error']}"
                R["traceback"] = traceback.format_exc()[-8000:]
        finally:
            entry["seconds"] = round(time.time() - t0, 3)
            try:
                mem.sample()
            except Exception:
                pass
            entry["peak_reserved_device"] = mem.peak - mem.start
            st = own_stats(args.allocator, torch)
            entry["peak_reserved_own"] = st.get("reserved_bytes.all.peak")
            entry["peak_allocated_own"] = st.get("allocated_bytes.all.peak")
            entry["num_ooms"] = st.get("num_ooms")
            save()
        if not entry["ok"]:
            break
    R["ok"] = R["max_batch"] is not None and not R.get("error")
    R["all_fit"] = R["first_oom_batch"] is None and R["max_batch"] == sizes[-1]
    log(f"max batch {R['max_batch']} (first OOM at {R['first_oom_batch']})")


if __name__ == "__main__":
    main()
