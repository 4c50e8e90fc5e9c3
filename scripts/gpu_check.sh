#!/usr/bin/env bash
# Check every CUDA path of parallel-bench on a bare GPU machine in one command: torch
# preinstalled, no network, nothing installed from the project (it runs the checkout).
#
#   scripts/gpu_check.sh OUTDIR          # on a machine with >= 1 GPU
#   scripts/gpu_check.sh --cpu OUTDIR    # the same sequence on CPU at tiny sizes (CI runs it)
#   scripts/gpu_check.sh --deps DIR OUTDIR
#       DIR holds what the machine cannot download: horovod-wheelhouse/ (filled by
#       `scripts/build_horovod.py --fill-only [--python-version 3.12]`) and/or an apex 25.05
#       source tarball apex-25.05.tar.gz (`git archive --prefix=apex-25.05/ 25.05`); both are
#       built offline into OUTDIR/site, which the rest of the check imports.
#
# With one GPU the 2-rank items share it (--backend gloo): a correctness check.
# One line per item (pass / FAIL / skip with the reason); logs, records and summary.txt in
# OUTDIR; exit 1 if anything failed. PYTHON picks the interpreter (default: .venv's, else
# python3).
set -u
mode=gpu deps=
while [ $# -gt 1 ]; do
  case $1 in
    --cpu) mode=cpu; shift ;;
    --deps) deps=$(cd "${2:?--deps DIR}" && pwd) || exit 2; shift 2 ;;
    *) break ;;
  esac
done
out=${1:?usage: scripts/gpu_check.sh [--cpu] [--deps DIR] OUTDIR}
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
  shared=$([ "$gpus" -ge 2 ] && echo "" || echo "--backend gloo")  # 2 ranks on one GPU
else
  where=(--cpu)
  size=(--data synthetic --train-limit 128 --test-limit 16 --epochs 2 --width 0.125
        --batch-size 32)
  shared=
fi
run() { "$py" -m bench run "${where[@]}" "${size[@]}" --no-progress --output "$out/results" "$@"; }

say "parallel-bench check ($mode) $(date -u +%FT%TZ): $("$py" -m bench --version 2>&1)"
if [ -n "$deps" ]; then
  export PYTHONPATH="$out/site:$PYTHONPATH" PATH="$out/site/bin:$PATH"
  [ -d "$deps/horovod-wheelhouse" ] && item build_horovod "$py" scripts/build_horovod.py \
    --wheelhouse "$deps/horovod-wheelhouse" --target "$out/site"
  apex_src=$(ls -d "$deps"/apex-25.05* 2>/dev/null | head -1)
  [ -n "$apex_src" ] && item build_apex env APEX_SRC="$apex_src" "$py" scripts/build_apex.py \
    --target "$out/site"
fi
[ $mode = gpu ] && item pytest_gpu "$py" -m pytest -q -m gpu tests
for s in $("$py" -c "import strategies; print(' '.join(strategies.names()))"); do
  item "n1_$s" run --strategy "$s" --gpus 1
done
# shellcheck disable=SC2086  # $shared is empty or two words
for s in ddp ddp-amp horovod ddp-apex fsdp; do item "n2_$s" run --strategy "$s" --gpus 2 $shared; done
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
# shellcheck disable=SC2086
item verify "$py" -m bench verify "${where[@]}" --gpus 2 $shared
if [ $mode = gpu ]; then
  item throughput "$py" benchmarks/throughput.py --strategies ddp,ddp-amp --gpus 1 \
    --output "$out/throughput"
fi
item report "$py" -m bench report --results "$out/results"
say "parallel-bench check: $passed passed, $failed failed, $skipped skipped"
[ $failed -eq 0 ]
