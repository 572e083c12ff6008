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

export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}

checkpoint() {
  timeout 30 "$PY" "$HERE/summarize_dist.py" "$WORK" > /dev/null 2> "$WORK/logs/summarize.err" \
    && cp "$WORK/dist_summary.md" "$OUT/dist_summary.md.tmp" && mv "$OUT/dist_summary.md.tmp" "$OUT/dist_summary.md"
  tar -czf "$OUT/dist_results.tar.gz.tmp" -C "$WORK" runs logs runs.txt skipped.txt 2> /dev/null \
    && mv "$OUT/dist_results.tar.gz.tmp" "$OUT/dist_results.tar.gz"
}

JOB_OK_LINES='\] \[rank [0-9]+/[0-9]+\] done'
source "$HERE/gpu_jobs.sh"

say "run_dist.sh: $NPROC GPU(s), budget ${BUDGET}s, $MODEL, $STEPS steps, batch $BATCH per rank $EXTRA; out $OUT"
nvidia-smi -L 2>&1 | head -n 8
ngpu=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU' || true)
if [[ -n $ngpu ]] && (( ngpu > 0 && ngpu < NPROC )); then
  say "only $ngpu GPU(s) visible, asked for $NPROC: using $ngpu" | tee -a "$WORK/skipped.txt"
  NPROC=$ngpu
fi

# dist MODE ALLOC: one torchrun job.
dist() {
  local mode=$1 alloc=$2
  if [[ $alloc == gmlake && $have_gmlake == 0 ]]; then
    echo "SKIP $mode.$alloc: no libgmlake_torch.so" >> "$WORK/skipped.txt"
    return 99
  fi
  # shellcheck disable=SC2086
  job "$mode.$alloc" "$NEED" "$RUN_TIMEOUT" "$PY" -m torch.distributed.run --standalone --nproc_per_node="$NPROC" \
    "$HERE/train_dist.py" --mode "$mode" --allocator "$alloc" --model "$MODEL" --steps "$STEPS" \
    --batch "$BATCH" --out "$WORK/runs" $EXTRA
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
