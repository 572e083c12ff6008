# examples/torch/gpu_jobs.sh - sourced by run_gpu.sh and run_dist.sh (not run on its own).
#
# Expects: OUT (the output folder), WORK (the scratch folder with logs/), ROOT, BUDGET,
# RESERVE, T0, and a function `checkpoint` (refreshes OUT from WORK). Gives: the
# environment every run has, the budget helpers, `have_gmlake`, and `job`.

# No NVLink multicast anywhere (NCCL, PyTorch's symmetric memory, NVSHMEM); the
# deterministic and offline settings of train.py.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
unset PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF   # the training scripts set them per run
export GMLAKE_TORCH_LIB=${GMLAKE_TORCH_LIB:-$ROOT/build/examples/torch/libgmlake_torch.so}

elapsed() { echo $(( SECONDS - T0 )); }
left() { echo $(( BUDGET - RESERVE - (SECONDS - T0) )); }
say() { echo "[$(elapsed)s] $*"; }

say "gmlake plugin: $GMLAKE_TORCH_LIB"
have_gmlake=1
# gmlake_torch.enable() takes the native extension (_gmlake_torch, pip-installed)
# when python can import it, else the pluggable library.
if ${PY:-python3} -c 'import torch, _gmlake_torch' 2>/dev/null; then
  say "gmlake: native extension _gmlake_torch"
elif [[ ! -f $GMLAKE_TORCH_LIB ]]; then
  have_gmlake=0
  say "gmlake plugin NOT FOUND: the gmlake runs are skipped (build it: meson setup build && ninja -C build)" \
    | tee -a "$WORK/skipped.txt"
fi

# job NAME NEED_S TIMEOUT_S command...: runs the command with its log in
# WORK/logs/NAME.log, unless fewer than NEED_S seconds of the budget are left (the
# timeout is cut to what is left); then reports, lists the log's lines that match
# $JOB_OK_LINES (a regex) or its errors and tail, and calls checkpoint. Returns the
# command's status, 99 when skipped.
job() {
  local name=$1 need=$2 lim=$3 l rc t
  shift 3
  l=$(left)
  if (( l < need )); then
    say "SKIP $name: ${l}s of the budget left, it needs about ${need}s" | tee -a "$WORK/skipped.txt"
    return 99
  fi
  (( lim > l )) && lim=$l
  say "RUN  $name (timeout ${lim}s)"
  t=$SECONDS
  timeout -k 5 "$lim" "$@" > "$WORK/logs/$name.log" 2>&1
  rc=$?
  echo "$name rc=$rc seconds=$(( SECONDS - t ))" >> "$WORK/runs.txt"
  if (( rc == 0 )); then
    say "     $name ok in $(( SECONDS - t ))s"
    grep -E "${JOB_OK_LINES:-^$}" "$WORK/logs/$name.log" | tail -n 4 | sed 's/^/       | /'
  else
    say "     $name FAILED (rc=$rc$( ((rc == 124 || rc == 137)) && echo ', timeout')) in $(( SECONDS - t ))s; log tail:"
    grep -E 'FAILED during|Error|error' "$WORK/logs/$name.log" | head -n 4 | sed 's/^/       | /'
    tail -n 4 "$WORK/logs/$name.log" | sed 's/^/       | /'
  fi
  checkpoint
  return $rc
}
