#!/usr/bin/env bash
# What only a GPU can show beyond the check (the standing GPU issue's items 2 to 5), stage after
# stage, each within the seconds it is given (a run that would start too late to finish is
# not started, one still running at its stage's end is stopped):
#
#   overhead  benchmarks/overhead.py: bench run --strategy ddp --gpus 1 against a plain loop of
#             the same model, batch and on-device data (the GPU otherwise idle)
#   profile   the fastest path's kernels (torch.compile default mode: the kernels CUDA graphs
#             replay), its record's MFU, and the top kernels of its profiler trace
#   accuracy  the calibrated parity workload (bench parity's WORKLOAD, on CUDA) at N = 2, 4, 8
#             ranks sharing the one GPU over gloo: ddp with SyncBN and with per-replica BN,
#             ddp-amp fp16 and bf16; seed after seed in two lanes, as many as fit (each sweep
#             resumes, so a pass adds one seed to every row)
#   fit       bench fit at N = 1 capped at 24 GiB: ResNet-50 and ViT-B/16 at 224 px, ddp
#             (TF32), ddp-amp bf16, fsdp; one lane per model
#
# What the 2026-11-27 lease taught (all four side by side with the GPU check): the fits'
# 224-px tries (40-55 s each) took the GPU from the accuracy runs, whose 64-step epochs then
# took 6-18 s; so the stages run one after another, and the fits start where that lease
# bracketed them (ResNet-50 TF32: 256 ok, 512 not; ViT-B/16 TF32: 160 ok, 192 not).
#
# usage: scripts/gpu_measure.sh WORKDIR BACK [STAGE=SECONDS ...]
#        (default: overhead=110 profile=110 accuracy=240 fit=150, in that order)
# BACK receives measure.txt (every result line) and measure.tar.gz (records, logs, JSON).
set -u
work=$1 back=$2; shift 2
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(overhead=110 profile=110 accuracy=240 fit=150)
py=${PYTHON:-python3}
mkdir -p "$work"/{logs,fit} "$back"
work=$(cd "$work" && pwd)
summary=$back/measure.txt
begun=$(date +%s) stage_end=0
say() { echo "[$(($(date +%s) - begun))s] $*" | tee -a "$summary"; }
left() { echo $((stage_end - $(date +%s))); }
pack() { tar czf "$back/measure.tar.gz" -C "$work" --exclude='*.trace.json' . 2>/dev/null; }

# The parity workload as bench parity states it, on CUDA (its --cpu left out).
workload=$($py -c 'from bench.commands.parity import WORKLOAD
print(" ".join(a for a in WORKLOAD if a != "--cpu"))') || { say "no workload"; exit 2; }

accuracy_lane() {  # configs "strategy|extra options", seed-major
  local pass cfg strategy extra t
  for pass in 1 2 3 4 5 6; do
    for cfg in "$@"; do
      t=$(left)
      [ "$t" -gt 20 ] || { say "accuracy lane stops before seed pass $pass ($cfg)"; return; }
      strategy=${cfg%%|*} extra=${cfg#*|}
      # shellcheck disable=SC2086  # the workload and extra are words
      timeout -k 10 "$t" $py -m bench sweep --strategies "$strategy" --gpus 2,4,8 \
        --repeats "$pass" $workload $extra --backend gloo --output "$work/accuracy" \
        >> "$work/logs/accuracy-$strategy${extra// /}.log" 2>&1
      say "accuracy $strategy $extra pass $pass: exit $?"
    done
  done
}

fit_lane() {  # model, then "strategy|extra options"
  local model=$1 cfg strategy extra t name; shift
  for cfg in "$@"; do
    t=$(left)
    [ "$t" -gt 30 ] || { say "fit $model: no time for $cfg"; return; }
    strategy=${cfg%%|*} extra=${cfg#*|} name="$model-$strategy${extra// /}"
    # shellcheck disable=SC2086
    timeout -k 10 "$t" $py -m bench fit --strategy "$strategy" --gpus 1 --gpu-memory 24 \
      --max-tries 6 --max-minutes "$(awk "BEGIN{print ($t - 10) / 60}")" \
      --model "torchvision:$model" --image-size 224 --data synthetic $extra --json \
      > "$work/fit/$name.json" 2> "$work/logs/fit-$name.log"
    say "fit $name: exit $? $($py -c 'import json,sys
try: r=json.load(open(sys.argv[1]))
except Exception as e: print("no result:", e); raise SystemExit
print({k: v for k, v in r.items() if not isinstance(v, (list, dict))})' "$work/fit/$name.json")"
  done
}

stage_overhead() {
  timeout -k 10 "$(left)" $py benchmarks/overhead.py --gpu --worlds 1 --width 1 --batch 256 \
    --steps 32 --epochs 3 --repeats 2 2>&1 | tee -a "$summary" > "$work/logs/overhead.log"
}

stage_profile() {
  timeout -k 10 "$(left)" $py -m bench run --strategy ddp-amp --gpus 1 --precision bf16 \
    --loader gpu --channels-last --optimizer-impl fused --compile --data synthetic \
    --train-limit 50000 --test-limit 10000 --batch-size 512 --epochs 2 --profile-steps 10 \
    --no-progress --output "$work/profile" > "$work/logs/profile.log" 2>&1
  say "profile run: exit $?"
  $py scripts/top_kernels.py "$work/profile" >> "$summary" 2>&1
}

stage_accuracy() {
  accuracy_lane "ddp|" "ddp|--no-syncbn" &
  accuracy_lane "ddp-amp|--precision fp16" "ddp-amp|--precision bf16" &
  wait
  $py -m bench report --results "$work/accuracy" > "$work/accuracy-report.txt" 2>&1
  head -40 "$work/accuracy-report.txt" >> "$summary"
}

stage_fit() {
  fit_lane resnet50 "ddp|--start 256" "ddp-amp|--precision bf16 --start 256" "fsdp|--start 256" &
  fit_lane vit_b_16 "ddp|--start 128" "ddp-amp|--precision bf16 --start 128" "fsdp|--start 128" &
  wait
}

for stage in "${stages[@]}"; do
  name=${stage%%=*} seconds=${stage#*=}
  declare -F "stage_$name" > /dev/null || { say "no stage $name"; continue; }
  stage_end=$(($(date +%s) + seconds))
  say "stage $name (${seconds}s)"
  "stage_$name"
  pack
done
say "done"
