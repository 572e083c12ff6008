#!/usr/bin/env bash
# run_gpu.sh OUTDIR [BUDGET_SECONDS] - the GPU measurement of gmlake in PyTorch training.
#
#   examples/torch/run_gpu.sh OUTDIR [budget seconds, default 540]
#
# 1. the matrix: 3 models x 4 allocators (default, expandable, cudamallocasync,
#    gmlake), STEPS (default 10) steps each, same seed, one process per run;
# 2. two short trace captures (default allocator) into traces/*.trace.gz, validated;
# 3. the cap experiment: the largest batch each allocator trains under one memory
#    cap (OPT-1.3B with checkpointing, see CAP below), default and gmlake first;
# 4. summarize.py: summary.md.
# Every run has its own process, `timeout` and log; a failed run is reported and
# the next one starts. The wall-clock budget is watched: a run that would not fit
# in what is left is skipped (and listed in summary.md) rather than started.
#
# OUTDIR ends up with few files (the device machine returns at most 8):
#   summary.md        the tables
#   results.tar.gz    runs/*.json, logs/*.log, traces/*.trace.gz, runs.txt, skipped.txt
#   driver.log        this script's own output
# The work happens in a scratch folder; results.tar.gz and summary.md are
# refreshed after every run, so a hard kill still leaves what was done.
#
# Environment: GMLAKE_TORCH_LIB (default build/examples/torch/libgmlake_torch.so;
# when missing, the gmlake runs are skipped), PYTHON (default python3), STEPS,
# MODELS (step 1; empty: none), ROUNDS and ROUNDS_MODEL (throughput rounds, step 1b),
# CAPTURES (step 2; 0: none), CAP, BATCHES and CAP_ALLOCS (step 3; empty: none).
# Throughput only: MODELS= CAPTURES=0 CAP_ALLOCS= ROUNDS=3 run_gpu.sh OUT 540.
set -u

OUT=${1:?usage: run_gpu.sh OUTDIR [budget seconds, default 540]}
BUDGET=${2:-540}
RESERVE=15   # seconds kept for the last summary and tarball
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PY=${PYTHON:-python3}
STEPS=${STEPS:-10}
T0=$SECONDS

mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gmlake-torch.XXXXXX") || exit 1
mkdir -p "$WORK/runs" "$WORK/logs" "$WORK/traces"
: > "$WORK/runs.txt"
: > "$WORK/skipped.txt"
exec > >(tee -a "$OUT/driver.log") 2>&1

# Refreshes OUTDIR/summary.md and OUTDIR/results.tar.gz from the scratch folder.
checkpoint() {
  timeout 60 "$PY" "$HERE/summarize.py" "$WORK" > /dev/null 2> "$WORK/logs/summarize.err" \
    && cp "$WORK/summary.md" "$OUT/summary.md.tmp" && mv "$OUT/summary.md.tmp" "$OUT/summary.md"
  tar -czf "$OUT/results.tar.gz.tmp" -C "$WORK" runs logs traces runs.txt skipped.txt 2> /dev/null \
    && mv "$OUT/results.tar.gz.tmp" "$OUT/results.tar.gz"
}

JOB_OK_LINES='^\[ *[0-9.]+s\] (done|max batch|trace)'
source "$HERE/gpu_jobs.sh"

say "run_gpu.sh: budget ${BUDGET}s, out $OUT, scratch $WORK"
nvidia-smi -L 2>&1 | head -n 4
# preflight: versions, and it warms the file cache for the first real run
job preflight 20 90 "$PY" -c "import torch, transformers, peft; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu', torch.cuda.is_available() and torch.cuda.get_device_name(0)); print('transformers', transformers.__version__, 'peft', peft.__version__)"
cat "$WORK/logs/preflight.log"

ALLOCS=(default expandable cudamallocasync gmlake)
train() {  # train NAME NEED TIMEOUT allocator args...
  local name=$1 need=$2 lim=$3 alloc=$4
  shift 4
  if [[ $alloc == gmlake && $have_gmlake == 0 ]]; then
    echo "SKIP $name: no libgmlake_torch.so" >> "$WORK/skipped.txt"
    return 99
  fi
  job "$name" "$need" "$lim" "$PY" "$HERE/train.py" --allocator "$alloc" --out "$WORK/runs" "$@"
}

# 1. The matrix. Batch sizes are train.py's defaults: 16 (GPT-2 medium, seq
#    64..1024 per step), 8 (OPT-1.3B ckpt, seq 1024), 8 (TinyLlama LoRA ckpt,
#    seq 128..2048). A run takes about 20-40 s, mostly imports and model build.
for model in ${MODELS-gpt2-dynseq opt1.3b-ckpt llama1b-lora-ckpt}; do
  for a in "${ALLOCS[@]}"; do
    train "$model.$a" 35 150 "$a" --model "$model" --steps "$STEPS"
  done
done

# 1b. Throughput rounds (ROUNDS, default 0: off): ROUNDS_MODEL (default gpt2-dynseq)
#    again under every allocator, ROUNDS times, the order rotated each round, so that
#    the % of default is a median over rounds rather than one run against one run
#    (one run's tokens/s moved by up to 6% between sessions on the H200).
ROUNDS=${ROUNDS:-0}
ROUNDS_MODEL=${ROUNDS_MODEL:-gpt2-dynseq}
for ((r = 1; r <= ROUNDS; r++)); do
  for ((i = 0; i < ${#ALLOCS[@]}; i++)); do
    a=${ALLOCS[$(((i + r) % ${#ALLOCS[@]}))]}
    train "$ROUNDS_MODEL.$a.round$r" 35 150 "$a" --model "$ROUNDS_MODEL" --steps "$STEPS" --tag "round$r"
  done
done

# 2. Two short traces of our own, default allocator (only it records history):
#    GPT-2 small with sequence length random per step, and a small Llama with LoRA
#    and checkpointing; 6 iterations each, a few hundred KB. Before the cap experiment
#    because they are cheap (~15 s each) and the cap experiment is the longest part.
if [[ ${CAPTURES:-1} == 1 ]]; then
train gpt2s-dynseq.capture 30 90 default --model gpt2s-dynseq --steps 6 --batch 8 \
  --capture "$WORK/traces/gpt2s-dynseq.trace.gz"
train llama-small-lora-ckpt.capture 30 90 default --model llama-small-lora-ckpt --steps 6 --batch 4 \
  --capture "$WORK/traces/llama-small-lora-ckpt.trace.gz"
for t in "$WORK"/traces/*.trace.gz; do
  [[ -f $t ]] && "$PY" "$HERE/capture_trace.py" --validate "$t"
done
fi

# 3. The cap experiment. OPT-1.3B ckpt at seq 1024 needs about 21 GB of static
#    state (fp32 weights, grads, AdamW moments) plus, from bench/peers/,
#    about 5.3 GB more at batch 8 (26.4 GB live, 31.4 GB reserved by PyTorch's
#    default allocator: 16% fragmentation). Under a 32 GiB (34.4 GB) cap the default
#    allocator then runs out a little above batch 8 while an allocator with ~1-3%
#    fragmentation gets some 5-6 GB further (depending on how activation memory
#    grows with batch, about batch 16-28). All four get the same cap and the same
#    batch list, in increasing order, 2 steps each, stopping at the first OOM;
#    a batch of 4 first, so that "fits nothing on the list" cannot happen unnoticed.
#    Caveat: PyTorch's cudaMallocAsync backend checks the fraction against bytes in
#    use, not against its pool's reserve; summary.md shows the device view too.
CAP=${CAP:-34359738368}
BATCHES=${BATCHES:-4,8,12,16,20,24,28,32,40,48,56,64}
for a in ${CAP_ALLOCS-default gmlake expandable cudamallocasync}; do
  train "opt1.3b-ckpt.$a.maxbatch" 50 150 "$a" --model opt1.3b-ckpt --steps 2 --limit "$CAP" \
    --find-max-batch "$BATCHES"
done

# 4. Summary.
checkpoint
say "done in $(elapsed)s; skipped:"
cat "$WORK/skipped.txt"
echo
cat "$OUT/summary.md" 2> /dev/null || say "no summary.md (see $WORK/logs/summarize.err)"
ls -la "$OUT"
exit 0
