#!/usr/bin/env python3
"""train_dist.py - one data-parallel training run (DDP or FSDP) with a chosen allocator.

    torchrun --standalone --nproc_per_node=N examples/torch/train_dist.py \
        --mode {ddp,fsdp} --allocator {default,expandable,cudamallocasync,gmlake} \
        --model gpt2-dynseq --steps 8 --batch 8 --out DIR

Every rank is one process (torchrun sets LOCAL_RANK, RANK, WORLD_SIZE). Each rank:
  1. sets the allocator as train.py does, before CUDA starts: PYTORCH_CUDA_ALLOC_CONF
     (and PYTORCH_ALLOC_CONF) before `import torch`, or gmlake_torch.enable() before
     torch.cuda.set_device();
  2. torch.cuda.set_device(LOCAL_RANK), init_process_group("nccl"), one warm-up
     all-reduce (the NCCL communicator exists before memory is measured);
  3. builds the model with train.build_model (same seed on every rank: same weights);
  4. ddp:  DistributedDataParallel(model, device_ids=[LOCAL_RANK]); activation
           checkpointing as the model spec says (--ckpt on/off overrides);
     fsdp: full sharding, one unit per transformer block plus the root, bf16
           parameters for compute (reduce in fp32), activation checkpointing on
           (non-reentrant, transformers' gradient_checkpointing_enable). FSDP2
           (torch.distributed.fsdp.fully_shard) when importable, else FSDP1
           (FullyShardedDataParallel, FULL_SHARD, per-block auto wrap);
  5. trains --steps steps under bf16 autocast with AdamW, the deterministic settings
     of train.py; the sequence length of a step is the same on every rank (drawn from
     --seed), the tokens differ per rank (generator seeded with seed + rank; rank 0
     gets exactly train.py's tokens);
  6. all-reduces the loss (mean over ranks) for the record; keeps the rank's own too;
  7. writes DIR/dist.<mode>.<allocator>.rank<r>.json (also while it runs): losses
     (global mean and local, with float.hex()), tokens/s of this rank after warm-up
     (first 3 steps left out), peak reserved in the device view (total - free from
     torch.cuda.mem_get_info, sampled after every forward, backward and optimizer
     step, minus the value after NCCL init), the allocator's own peak reserved and
     allocated (torch.cuda.memory_stats, or gmlake_torch.memory_stats), a checksum
     of this rank's parameters after training, errors;
  8. destroy_process_group().

Exit status 0 when the rank's run succeeded. Reuses train.py (imported as a module).
"""

import argparse
import datetime
import os
import platform
import signal
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import train as T  # noqa: E402  (no torch import at module level)

SCHEMA = "gmlake-torch-dist/1"
MODES = ("ddp", "fsdp")
R = T.R  # the result dict train.save() writes; shared so train's helpers fill it too

RANK = int(os.environ.get("RANK", "0"))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "1"))


def log(msg):
    T.log(f"[rank {RANK}/{WORLD_SIZE}] {msg}")


def parse_args(argv):
    ap = argparse.ArgumentParser(description="One DDP/FSDP training run (torchrun) with a chosen allocator.")
    ap.add_argument("--mode", required=True, choices=MODES)
    ap.add_argument("--allocator", required=True, choices=list(T.ALLOC_CONF))
    ap.add_argument("--model", default="gpt2-dynseq", choices=sorted(T.MODELS))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8, help="batch size per rank")
    ap.add_argument("--layers", type=int, default=0, help="override the model's layer count (0: the spec's)")
    ap.add_argument("--ckpt", choices=("auto", "on", "off"), default="auto",
                    help="activation checkpointing: auto = on for fsdp, the model spec's for ddp")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--gmlake-lib", default="", help="path of libgmlake_torch.so")
    ap.add_argument("--nccl-timeout", type=int, default=120, help="seconds (init_process_group timeout)")
    return ap.parse_args(argv)


def rank_batches(spec, steps, batch, seed, rank, torch):
    """Sequence lengths common to all ranks (from seed), tokens per rank (seed + rank)."""
    lens = [int(b.shape[1]) for b in T.make_batches(spec, steps, 1, seed, torch)]
    gen = torch.Generator().manual_seed(seed + rank)
    return [torch.randint(0, spec["vocab"], (batch, s), generator=gen, dtype=torch.long) for s in lens]


def find_blocks(model, nn):
    """The transformer blocks: the longest nn.ModuleList in the model."""
    best = None
    for _, m in model.named_modules():
        if isinstance(m, nn.ModuleList) and len(m) > 0 and (best is None or len(m) > len(best)):
            best = m
    if best is None:
        raise RuntimeError("no nn.ModuleList of blocks found in the model")
    return list(best)


def wrap_fsdp(model, torch, local_rank):
    """Full sharding, one unit per block plus the root, bf16 params / fp32 reduce."""
    import torch.nn as nn

    blocks = find_blocks(model, nn)
    info = {"units": len(blocks) + 1, "block_class": type(blocks[0]).__name__}
    try:
        try:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        except ImportError:
            from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
        from torch.distributed.device_mesh import init_device_mesh
    except ImportError as e:
        info["fully_shard_import_error"] = f"{type(e).__name__}: {e}"
        fully_shard = None
    if fully_shard is not None:
        mesh = init_device_mesh("cuda", (WORLD_SIZE,))
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for b in blocks:
            fully_shard(b, mesh=mesh, reshard_after_forward=True, mp_policy=mp)
        fully_shard(model, mesh=mesh, reshard_after_forward=True, mp_policy=mp)
        info.update(impl="FSDP2 fully_shard", reshard_after_forward=True,
                    mixed_precision="param bf16, reduce fp32")
        return model, info
    # FSDP1 fallback
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    block_types = {type(b) for b in blocks}
    model = FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD,
                 auto_wrap_policy=ModuleWrapPolicy(block_types),
                 mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                                buffer_dtype=torch.bfloat16),
                 device_id=torch.device("cuda", local_rank), use_orig_params=True,
                 limit_all_gathers=True)
    info.update(impl="FSDP1 FullyShardedDataParallel FULL_SHARD", mixed_precision="param bf16, reduce fp32")
    return model, info


def param_checksum(model, torch):
    """Sum (float64) of this rank's parameter values (local shards under FSDP)."""
    tot = torch.zeros((), dtype=torch.float64, device="cuda")
    with torch.no_grad():
        for p in model.parameters():
            t = p.to_local() if hasattr(p, "to_local") else p
            tot += t.detach().double().sum()
    return float(tot.item())


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    spec = dict(T.MODELS[args.model])
    if args.layers:
        spec["layers"] = args.layers
    ckpt = {"on": True, "off": False, "auto": True if args.mode == "fsdp" else spec["ckpt"]}[args.ckpt]
    spec["ckpt"] = ckpt
    os.makedirs(args.out, exist_ok=True)
    T.OUT_PATH = os.path.join(args.out, f"dist.{args.mode}.{args.allocator}.rank{RANK}.json")
    T.set_alloc_env(args.allocator)
    R.update({
        "schema": SCHEMA, "kind": "dist", "mode": args.mode, "model": args.model, "allocator": args.allocator,
        "rank": RANK, "local_rank": LOCAL_RANK, "world_size": WORLD_SIZE,
        "ok": False, "error": None, "phase": "start", "argv": [sys.executable] + sys.argv,
        "alloc_conf": T.ALLOC_CONF[args.allocator] or None,
        "env": {k: os.environ.get(k) for k in (
            "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "CUBLAS_WORKSPACE_CONFIG", "GMLAKE_TORCH_LIB",
            "CUDA_VISIBLE_DEVICES", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
            "NVSHMEM_DISABLE_NVLS", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")},
        "python": platform.python_version(), "host": platform.node(),
        "seed": args.seed, "batch": args.batch, "steps": args.steps, "lr": args.lr, "ckpt": ckpt,
        "model_spec": spec, "warmup_steps": T.WARMUP, "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
    })
    T.save()
    signal.signal(signal.SIGTERM, T.on_signal)
    signal.signal(signal.SIGINT, T.on_signal)

    T.keep_determinism_warnings()

    torch = None
    dist = None
    mem = None
    ok_pg = False
    try:
        R["phase"] = "import torch"
        t0 = time.time()
        import torch
        import torch.distributed as dist
        R["torch"] = torch.__version__
        R["cuda"] = torch.version.cuda
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda is not available")
        if torch.cuda.device_count() <= LOCAL_RANK:
            raise RuntimeError(f"LOCAL_RANK {LOCAL_RANK} but only {torch.cuda.device_count()} GPUs visible")
        if args.allocator == "gmlake":
            R["phase"] = "gmlake enable"
            import gmlake_torch
            T._GM = gmlake_torch  # train.own_stats / gm_ooms read it
            R["gmlake_lib"] = gmlake_torch.enable(lib=args.gmlake_lib or None)
            log(f"gmlake enabled: {R['gmlake_lib']}")
        R["phase"] = "cuda init"
        torch.cuda.set_device(LOCAL_RANK)  # initializes CUDA (after the allocator is chosen)
        torch.manual_seed(args.seed)
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
        free, total = torch.cuda.mem_get_info()
        R["device_used_before_nccl"] = int(total - free)
        try:
            R["allocator_backend"] = torch.cuda.get_allocator_backend()
        except Exception:
            R["allocator_backend"] = None
        if args.allocator == "cudamallocasync" and R["allocator_backend"] != "cudaMallocAsync":
            raise RuntimeError(f"asked for cudaMallocAsync, PyTorch uses {R['allocator_backend']!r}")

        R["phase"] = "init_process_group"
        timeout = datetime.timedelta(seconds=args.nccl_timeout)
        try:
            dist.init_process_group(backend="nccl", timeout=timeout,
                                    device_id=torch.device("cuda", LOCAL_RANK))
        except TypeError:  # torch without device_id=
            dist.init_process_group(backend="nccl", timeout=timeout)
        ok_pg = True
        if dist.get_world_size() != WORLD_SIZE or dist.get_rank() != RANK:
            raise RuntimeError(f"process group says rank {dist.get_rank()}/{dist.get_world_size()}, "
                               f"environment {RANK}/{WORLD_SIZE}")
        try:
            R["nccl_version"] = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:
            R["nccl_version"] = None
        warm = torch.ones(1, device="cuda")
        dist.all_reduce(warm)  # creates the communicator (and its buffers) now
        torch.cuda.synchronize()
        if int(warm.item()) != WORLD_SIZE:
            raise RuntimeError(f"warm-up all_reduce gave {warm.item()}, expected {WORLD_SIZE}")
        del warm
        mem = T.DeviceMemory(torch)  # the start of the device view: after NCCL init
        R["gpu"] = torch.cuda.get_device_name()
        R["device_total_bytes"] = mem.total
        R["device_used_start"] = mem.start
        R["nccl_init_bytes"] = mem.start - R["device_used_before_nccl"]
        R["import_s"] = round(time.time() - t0, 3)
        T.save()

        R["phase"] = "build model"
        t0 = time.time()
        torch.manual_seed(args.seed)
        model = T.build_model(args.model, spec, torch, R)  # ckpt applied here, before wrapping
        mem.sample()
        R["phase"] = f"wrap {args.mode}"
        if args.mode == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model, device_ids=[LOCAL_RANK], output_device=LOCAL_RANK)
            R["wrap"] = {"impl": "DistributedDataParallel", "buckets": "default", "ckpt": ckpt}
        else:
            model, info = wrap_fsdp(model, torch, LOCAL_RANK)
            info["ckpt"] = ckpt
            R["wrap"] = info
        params = [p for p in model.parameters() if p.requires_grad]
        R["local_param_elems"] = int(sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in params))
        opt = torch.optim.AdamW(params, lr=args.lr)
        torch.cuda.synchronize()
        mem.sample()
        R["build_s"] = round(time.time() - t0, 3)
        log(f"built {args.model} ({spec['layers']} layers) under {R['wrap'].get('impl')}: "
            f"{R['param_count'] / 1e6:.1f} M params, {R['local_param_elems'] / 1e6:.1f} M trainable on this "
            f"rank, ckpt {ckpt}, {R['build_s']} s")
        T.save()

        R["phase"] = "train"
        t0 = time.time()
        rec = T.new_record()
        rec["local_losses"] = []
        rec["local_losses_hex"] = []
        R.update(rec)
        batches = rank_batches(spec, args.steps, args.batch, args.seed, RANK, torch)
        for i, ids_cpu in enumerate(batches):
            R["phase"] = f"step {i}"
            lv, loss, dt = T.train_step(model, opt, ids_cpu, torch, mem, args.allocator)
            g = loss.float().reshape(1).clone()
            dist.all_reduce(g, op=dist.ReduceOp.SUM)
            gv = float((g / WORLD_SIZE).item())
            T.record_step(rec, gv, dt, ids_cpu)  # the mean loss; the rank's own below
            rec["local_losses"].append(lv)
            rec["local_losses_hex"].append(lv.hex())
            del loss, g
            log(f"step {i}: batch {ids_cpu.shape[0]} seq {ids_cpu.shape[1]} loss {lv:.6f} (mean {gv:.6f}) "
                f"{dt * 1000:.1f} ms, device used {(mem.peak - mem.start) / 1e9:.2f} GB peak")
            T.save()
        R["tokens_per_s"] = T.tokens_per_s(rec)
        R["param_checksum"] = param_checksum(model, torch)
        R["param_checksum_hex"] = R["param_checksum"].hex()
        R["train_s"] = round(time.time() - t0, 3)
        R["ok"] = True
        R["phase"] = "done"
    except BaseException as e:  # noqa: B902 - record everything, then exit
        R["ok"] = False
        R["error"] = f"{type(e).__name__}: {e}"[:4000]
        R["traceback"] = traceback.format_exc()[-8000:]
        if torch is not None and T.is_oom(e, torch, 0, T._GM):
            R["oom"] = True
        log(f"FAILED during {R.get('phase')}: {R['error']}")
    finally:
        collect_end(args, torch, mem)
    if R.get("ok") and ok_pg:
        T.save()
        try:
            try:
                dist.barrier(device_ids=[LOCAL_RANK])
            except TypeError:
                dist.barrier()
            dist.destroy_process_group()
            R["destroyed_process_group"] = True
        except Exception as e:
            R["destroy_error"] = f"{type(e).__name__}: {e}"[:500]
    # a failed rank does not destroy the group (peers may hang in a collective);
    # torchrun stops the others when this one exits non-zero
    T.finish(0 if R.get("ok") else 1)


def collect_end(args, torch, mem):
    if torch is None:
        return
    if mem is not None:
        try:
            torch.cuda.synchronize()
            mem.sample()
        except Exception as e:
            R["end_sample_error"] = f"{type(e).__name__}: {e}"[:500]
        R["device_used_peak"] = mem.peak
        R["device_samples"] = mem.samples
        R["peak_reserved_device"] = mem.peak - mem.start
    st = T.own_stats(args.allocator, torch)
    R["own_stats"] = st
    R["peak_reserved_own"] = st.get("reserved_bytes.all.peak")
    R["peak_allocated_own"] = st.get("allocated_bytes.all.peak")
    R["peak_requested_own"] = st.get("requested_bytes.all.peak")
    R["num_alloc_retries"] = st.get("num_alloc_retries")
    R["num_ooms"] = st.get("num_ooms")
    if args.allocator == "gmlake":
        R["gmlake_invalid_frees"] = st.get("gmlake.invalid_frees")
    if R.get("ok"):
        log(f"done: peak reserved device {R.get('peak_reserved_device', 0) / 1e9:.3f} GB, own "
            f"{(R['peak_reserved_own'] or 0) / 1e9:.3f} GB, allocated {(R['peak_allocated_own'] or 0) / 1e9:.3f}"
            f" GB, tokens/s {R.get('tokens_per_s')}")
    T.save()


if __name__ == "__main__":
    main()
