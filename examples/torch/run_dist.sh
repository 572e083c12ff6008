#!/usr/bin/env bash
# run_dist.sh OUTDIR [NPROC] [BUDGET_S] - DDP and FSDP training under the four allocators.
#
#   examples/torch/run_dist.sh OUTDIR [GPUs per node, default 2] [budget seconds, default 230]
#
# {ddp, fsdp} x {default, expandable, cudamallocasync, gmlake}, each one
#   python3 -m torch.distributed.run --standalone --nproc_per_node=NPROC \
#       examples/torch/train_dist.py --mode M --allocator A --model $MODEL --steps $STEPS --batch $BATCH
# under `timeout`, then summarize_dist.py. Order: default and gmlake of each mode
# first (gmlake's correctness and its reference), then the other two, so a short
# budget still answers the main question. A run that would not fit in what is left
# of the budget is skipped (and listed). A failed run is reported, the next starts.
#
# OUTDIR ends up with 3 files:
#   dist_summary.md       the tables
#   dist_results.tar.gz   runs/*.json (one per rank), logs/*.log, runs.txt, skipped.txt
#   dist_driver.log       this script's own output
#
# Environment: GMLAKE_TORCH_LIB (default build/examples/torch/libgmlake_torch.so;
# when missing, the gmlake runs are skipped), PYTHON (default python3), MODEL
# (gpt2-dynseq), STEPS (8), BATCH (8, per rank), NEED (seconds one run is expected
# to take, 25), RUN_TIMEOUT (75), EXTRA (more train_dist.py arguments, e.g. "--layers 12").
set -u

OUT=${1:?usage: run_dist.sh OUTDIR [NPROC, default 2] [budget seconds, default 230]}
NPROC=${2:-2}
BUDGET=${3:-230}
RESERVE=8    # seconds kept for the last summary and tarball
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PY=${PYTHON:-python3}
MODEL=${MODEL:-gpt2-dynseq}
STEPS=${STEPS:-8}
BATCH=${BATCH:-8}
NEED=${NEED:-25}
RUN_TIMEOUT=${RUN_TIMEOUT:-75}
EXTRA=${EXTRA:-}
T0=$SECONDS

mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gmlake-dist.XXXXXX") || exit 1
mkdir -p "$WORK/runs" "$WORK/logs"
: > "$WORK/runs.txt"
: > "$WORK/skipped.txt"
exec > >(tee -a "$OUT/dist_driver.log") 2>&1

# no NVLink multicast / NVLS anywhere (NCCL, symmetric memory, NVSHMEM)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
unset PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF   # train_dist.py sets them per run
export GMLAKE_TORCH_LIB=${GMLAKE_TORCH_LIB:-$ROOT/build/examples/torch/libgmlake_torch.so}

elapsed() { echo $(( SECONDS - T0 )); }
left() { echo $(( BUDGET - RESERVE - (SECONDS - T0) )); }
say() { echo "[$(elapsed)s] $*"; }

checkpoint() {
  timeout 30 "$PY" "$HERE/summarize_dist.py" "$WORK" > /dev/null 2> "$WORK/logs/summarize.err" \
    && cp "$WORK/dist_summary.md" "$OUT/dist_summary.md.tmp" && mv "$OUT/dist_summary.md.tmp" "$OUT/dist_summary.md"
  tar -czf "$OUT/dist_results.tar.gz.tmp" -C "$WORK" runs logs runs.txt skipped.txt 2> /dev/null \
    && mv "$OUT/dist_results.tar.gz.tmp" "$OUT/dist_results.tar.gz"
}

say "run_dist.sh: $NPROC GPU(s), budget ${BUDGET}s, $MODEL, $STEPS steps, batch $BATCH per rank $EXTRA; out $OUT"
say "gmlake plugin: $GMLAKE_TORCH_LIB"
have_gmlake=1
if [[ ! -f $GMLAKE_TORCH_LIB ]]; then
  have_gmlake=0
  say "gmlake plugin NOT FOUND: the gmlake runs are skipped (build it: meson setup build && ninja -C build)" \
    | tee -a "$WORK/skipped.txt"
fi
nvidia-smi -L 2>&1 | head -n 8
ngpu=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU' || true)
if [[ -n $ngpu ]] && (( ngpu > 0 && ngpu < NPROC )); then
  say "only $ngpu GPU(s) visible, asked for $NPROC: using $ngpu" | tee -a "$WORK/skipped.txt"
  NPROC=$ngpu
fi

# dist MODE ALLOC: one torchrun job.
dist() {
  local mode=$1 alloc=$2 name="$1.$2" l lim rc t
  if [[ $alloc == gmlake && $have_gmlake == 0 ]]; then
    echo "SKIP $name: no libgmlake_torch.so" >> "$WORK/skipped.txt"
    return 99
  fi
  l=$(left)
  if (( l < NEED )); then
    say "SKIP $name: ${l}s of the budget left, it needs about ${NEED}s" | tee -a "$WORK/skipped.txt"
    return 99
  fi
  lim=$RUN_TIMEOUT
  (( lim > l )) && lim=$l
  say "RUN  $name (timeout ${lim}s)"
  t=$SECONDS
  # shellcheck disable=SC2086
  timeout -k 5 "$lim" "$PY" -m torch.distributed.run --standalone --nproc_per_node="$NPROC" \
    "$HERE/train_dist.py" --mode "$mode" --allocator "$alloc" --model "$MODEL" --steps "$STEPS" \
    --batch "$BATCH" --out "$WORK/runs" $EXTRA > "$WORK/logs/$name.log" 2>&1
  rc=$?
  echo "$name rc=$rc seconds=$(( SECONDS - t ))" >> "$WORK/runs.txt"
  if (( rc == 0 )); then
    say "     $name ok in $(( SECONDS - t ))s:"
    grep -E '\] \[rank [0-9]+/[0-9]+\] done' "$WORK/logs/$name.log" | sed 's/^/       | /'
  else
    say "     $name FAILED (rc=$rc$( ((rc == 124 || rc == 137)) && echo ', timeout')) in $(( SECONDS - t ))s; log tail:"
    grep -E 'FAILED during|Error|error' "$WORK/logs/$name.log" | head -n 4 | sed 's/^/       | /'
    tail -n 4 "$WORK/logs/$name.log" | sed 's/^/       | /'
  fi
  checkpoint
  return $rc
}

for pair in ddp.default ddp.gmlake fsdp.default fsdp.gmlake \
            ddp.expandable ddp.cudamallocasync fsdp.expandable fsdp.cudamallocasync; do
  dist "${pair%%.*}" "${pair#*.}"
done

checkpoint
say "done in $(elapsed)s; skipped:"
cat "$WORK/skipped.txt"
echo
cat "$OUT/dist_summary.md" 2> /dev/null || { say "no dist_summary.md:"; cat "$WORK/logs/summarize.err"; }
ls -la "$OUT"
exit 0
