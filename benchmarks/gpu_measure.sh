#!/usr/bin/env bash
# One call on a one-GPU machine: the measurements behind docs/gpu_measurements.md.
#
#   bash benchmarks/gpu_measure.sh OUTDIR [WHEELS]
#
# Runs from the repository root with PYTHONPATH=src (no install of meshplan). The GPU machine has
# torch, numpy, typer, rich and PyYAML but may lack pydantic: WHEELS, a folder of wheels for it
# (pydantic, pydantic-core, annotated-types, typing-inspection, typing-extensions), is installed
# into a private target first. Every step has its own time limit and writes its JSON to OUTDIR as
# soon as it ends, so one failing step leaves the others' results. The verify kernels rows predict
# for the catalog H200 (the GPU measured), so their implied constants are fractions of its peaks;
# each kernel runs back to back for verify kernels' default --settle (1 s on a GPU) before it is
# timed. (The 2026-11-28 results predate --settle: their GEMM rows are bursts.)
set -u
out=${1:?usage: gpu_measure.sh OUTDIR [WHEELS]}
wheels=${2:-}
mkdir -p "$out"
log="$out/log.txt"
if [ -n "$wheels" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$wheels"/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
gpu=h200-sxm-141gb
{ date -u; nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm,clocks.max.mem,temperature.gpu --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())'; } >>"$log" 2>&1

step() {  # step FILE SECONDS COMMAND...: its standard output to OUTDIR/FILE, within a limit
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "== $name (limit ${limit}s)" >>"$log"
  timeout "$limit" "$@" >"$out/$name" 2>>"$log"
  local rc=$?
  echo "== $name rc=$rc in $((SECONDS - t0))s" | tee -a "$log"
}

k=(python3 -m meshplan.cli.app verify kernels --gpu "$gpu" --device cuda --json)

step k8b.json 150 "${k[@]}" --model llama3-8b --micro-batch 2 --seq-len 8192 --kernels compiled --layer-stacks eager,compiled
[ "${SKIP_SWEEP:-}" ] || step sweep.txt 120 python3 benchmarks/gpu_sweep.py --out "$out/sweep.json" --sustain 15
step k8b32k.json 120 "${k[@]}" --model llama3-8b --micro-batch 1 --seq-len 32768 --kernels compiled --layer-stacks compiled
step k70b.json 90 "${k[@]}" --model llama3-70b --tp 8 --micro-batch 16 --seq-len 8192 --kernels compiled --layer-stacks eager
step k8bfp8.json 60 "${k[@]}" --model llama3-8b --micro-batch 2 --seq-len 8192 --precision fp8 --kernels compiled --layer-stacks none
step k405b.json 80 "${k[@]}" --model llama3-405b --tp 8 --micro-batch 4 --seq-len 8192 --kernels compiled --layer-stacks eager
tail -c 3000 "$log"
