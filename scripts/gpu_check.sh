#!/usr/bin/env bash
# Check every CUDA path of parallel-bench on a bare GPU machine in one command: torch
# preinstalled, no network, nothing installed from the project (it runs the checkout).
#
#   scripts/gpu_check.sh OUTDIR          # on a machine with >= 1 GPU
#   scripts/gpu_check.sh --cpu OUTDIR    # the same sequence on CPU at tiny sizes (CI runs it)
#
# One line per item (pass / FAIL / skip with the reason); logs, records and summary.txt in
# OUTDIR; exit 1 if anything failed. PYTHON picks the interpreter (default: .venv's, else
# python3).
set -u
mode=gpu
if [ "${1:-}" = "--cpu" ]; then mode=cpu; shift; fi
out=${1:?usage: scripts/gpu_check.sh [--cpu] OUTDIR}
cd "$(dirname "$0")/.." || exit 2
mkdir -p "$out" && out=$(cd "$out" && pwd)
py=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
: > "$out/summary.txt"
passed=0 failed=0 skipped=0

say() { echo "$1" | tee -a "$out/summary.txt"; }

# item NAME CMD...: run, log to OUTDIR/NAME.log; exit 3 (strategy unavailable) is a skip.
item() {
  local name=$1; shift
  "$@" > "$out/$name.log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then say "pass  $name"; passed=$((passed + 1))
  elif [ $rc -eq 3 ]; then
    say "skip  $name: $(grep -m1 'unavailable here' "$out/$name.log" | cut -c1-160)"
    skipped=$((skipped + 1))
  else say "FAIL  $name (exit $rc, log $out/$name.log)"; failed=$((failed + 1)); fi
}

if [ $mode = gpu ]; then
  gpus=$("$py" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
  [ "$gpus" -ge 1 ] || { echo "no CUDA GPU visible; use --cpu" >&2; exit 2; }
  where=()
  size=(--data synthetic --train-limit 10240 --test-limit 2000 --epochs 2 --batch-size 256)
  two=$([ "$gpus" -ge 2 ] && echo 2 || echo 0)
else
  where=(--cpu)
  size=(--data synthetic --train-limit 128 --test-limit 16 --epochs 2 --width 0.125
        --batch-size 32)
  two=2
fi
run() { "$py" -m bench run "${where[@]}" "${size[@]}" --no-progress --output "$out/results" "$@"; }

say "parallel-bench check ($mode) $(date -u +%FT%TZ): $("$py" -m bench --version 2>&1)"
[ $mode = gpu ] && item pytest_gpu "$py" -m pytest -q -m gpu tests
for s in $("$py" -c "import strategies; print(' '.join(strategies.names()))"); do
  item "n1_$s" run --strategy "$s" --gpus 1
done
if [ "$two" = 2 ]; then
  for s in ddp ddp-amp horovod ddp-apex fsdp; do item "n2_$s" run --strategy "$s" --gpus 2; done
else
  say "skip  n2_*: one GPU (ranks cannot share a GPU under NCCL)"
fi
if [ $mode = gpu ]; then
  item precision_fp16 run --strategy ddp-amp --gpus 1 --precision fp16
  item precision_tf32_off run --strategy ddp --gpus 1 --tf32 off
  item precision_apex_o2 run --strategy ddp-apex --gpus 1 --apex-opt-level O2
  item workers4_pinned run --strategy ddp --gpus 1 --workers 4
fi
item precision_bf16 run --strategy ddp-amp --gpus 1 --precision bf16
item loader_gpu run --strategy ddp --gpus 1 --loader gpu
item channels_last run --strategy ddp --gpus 1 --channels-last
item fused_sgd run --strategy ddp --gpus 1 --optimizer-impl fused
item compile run --strategy ddp --gpus 1 --compile --epochs 1
item fastest_path run --strategy ddp-amp --gpus 1 --precision bf16 --loader gpu \
  --channels-last --optimizer-impl fused
item verify "$py" -m bench verify "${where[@]}" --gpus "$([ "$two" = 2 ] && echo 2 || echo 1)"
if [ $mode = gpu ]; then
  item throughput "$py" benchmarks/throughput.py --strategies ddp,ddp-amp --gpus 1 \
    --output "$out/throughput"
fi
item report "$py" -m bench report --results "$out/results"
say "parallel-bench check: $passed passed, $failed failed, $skipped skipped"
[ $failed -eq 0 ]
