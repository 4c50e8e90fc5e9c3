#!/usr/bin/env bash
# Check every CUDA path of parallel-bench on a bare GPU machine, in phases that each fit one
# command of a GPU lease (10 minutes a command; torch preinstalled, no network, nothing
# installed from the project: it runs the checkout). scripts/gpu_lease.py runs the items that
# matter most in one call of a 15-minute lease.
#
#   scripts/gpu_check.sh --plan [--phase P]               items and estimated seconds (H100)
#   scripts/gpu_check.sh [--cpu] --commands [--phase P]   each item's command, as it would run
#                                                         (tests/test_gpu_check.py parses every
#                                                         bench command among them)
#   scripts/gpu_check.sh [--deps DIR] --phase P OUTDIR    run phase P: build | core | options |
#                                                         variants | table | calibrate | all |
#                                                         next (what the first check left)
#   scripts/gpu_check.sh --cpu --phase P OUTDIR           the same items on CPU at tiny sizes (the
#                                                         long tier runs those no other test runs:
#                                                         tests/test_gpu_check.py)
#
#   --deps DIR     what the machine cannot download: horovod-wheelhouse/ and apex-25.05.tar.gz
#                  (`make gpu-deps`); the build phase builds both into OUTDIR/site, later phases
#                  import it; built wheels are kept in DIR/built (carry it back to skip builds)
#   --budget S     start no item whose recorded or estimated seconds would pass S seconds
#                  since this command started (it is listed as "deferred"; run it again), and
#                  end one still running CHECK_GRACE seconds (default 30) after S
#   --again        rerun items that passed before in this OUTDIR (default: skip them)
#   --items REGEX  only the items whose names match (e.g. to rerun what failed, or to run
#                  parts of a phase side by side); the summary is summary-PHASE-REGEX.txt
#
# Correctness items run small (width 0.25, 4,096 images, no communication probe); only the table
# and calibrate phases measure at full size. One line per item (pass / FAIL / skip with the
# reason / deferred) with its seconds; logs, records and summary-PHASE.txt in OUTDIR; exit 1 if
# an item failed. PYTHON: the interpreter (default: the first of .venv/bin/python,
# /opt/torch/.venv/bin/python3, python3 that imports torch). TABLE_WORKERS=W: the table's and
# calibration's runs use --workers W (their rows then say "W workers"; default: bench run's).
# TABLE_WORKERS=auto: W is the fewest workers that fed within 10 % of the best count in this
# OUTDIR's table_loader_sweep (run first in the table phase); bench run's default if it failed.
set -u
mode=gpu deps= phase=all budget=0 plan=0 again=0 items= commands=0
while [ $# -gt 0 ]; do
  case $1 in
    --cpu) mode=cpu; shift ;;
    --deps) deps=$(cd "${2:?--deps DIR}" && pwd) || exit 2; shift 2 ;;
    --phase) phase=${2:?--phase build|core|options|variants|table|calibrate|all|next}; shift 2 ;;
    --budget) budget=${2:?--budget SECONDS}; shift 2 ;;
    --plan) plan=1; shift ;;
    --commands) plan=1 commands=1; shift ;;
    --again) again=1; shift ;;
    --items) items=${2:?--items REGEX}; shift 2 ;;
    -*) echo "gpu_check.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
case $phase in build|core|options|variants|table|calibrate|all|next) ;;
  *) echo "gpu_check.sh: --phase must be build, core, options, variants, table, calibrate, all or next" >&2
     exit 2 ;;
esac
[[ $budget =~ ^[0-9]+$ ]] || { echo "gpu_check.sh: --budget takes whole seconds" >&2; exit 2; }
grace=${CHECK_GRACE:-30}
[[ $grace =~ ^[0-9]+$ ]] || { echo "gpu_check.sh: CHECK_GRACE takes whole seconds (got $grace)" >&2; exit 2; }
table_workers=${TABLE_WORKERS:-}
[[ $table_workers =~ ^([0-9]+|auto)?$ ]] ||
  { echo "gpu_check.sh: TABLE_WORKERS is a worker count or auto (got $table_workers)" >&2; exit 2; }
if [ $plan = 0 ]; then
  out=${1:?usage: scripts/gpu_check.sh [--cpu] [--deps DIR] [--phase P] [--budget S] OUTDIR}
else
  out=OUTDIR
fi
cd "$(dirname "$0")/.." || exit 2

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# What the check needs to know of an interpreter, in one start (torch takes ~2 s to import):
# its GPUs, the header line, the strategies' names, whether pytest-xdist imports.
facts() {
  "$1" - <<'PY'
import importlib.util
import torch
from bench import __version__
try:
    import strategies
    names = " ".join(strategies.names())
except Exception:  # an interpreter that only builds (make gpu-wheels) needs none
    names = ""
try:  # a broken driver is said as such, not as torch failing to import
    gpus = torch.cuda.device_count()
    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
except Exception as e:
    gpus, name = f"{type(e).__name__}: {e}".replace("\n", " "), ""
print("fact", gpus)
print("fact", f"bench {__version__} (torch {torch.__version__}, CUDA {torch.version.cuda}), "
      f"torch {torch.__version__} cuda {torch.version.cuda} {name}")
print("fact", names)
print("fact", int(importlib.util.find_spec("xdist") is not None))
PY
}
pick_python() {
  local candidate why
  for candidate in .venv/bin/python /opt/torch/.venv/bin/python3 python3; do
    command -v "$candidate" > /dev/null 2>&1 || continue
    if why=$(facts "$candidate" 2>&1); then echo "$candidate"; echo "$why"; return 0; fi
    echo "gpu_check.sh: $candidate cannot import torch: $(echo "$why" | tail -1)" >&2
  done
  return 1
}
if [ -n "${PYTHON:-}" ]; then
  py=$PYTHON
  about=$(facts "$py" 2>&1) || {
    echo "gpu_check.sh: PYTHON=$py cannot import torch: $(echo "$about" | tail -1)" >&2; exit 2; }
else
  about=$(pick_python) || { echo "gpu_check.sh: no interpreter here imports torch" >&2; exit 2; }
  py=$(echo "$about" | head -1) about=$(echo "$about" | tail -n +2)
fi
about=$(echo "$about" | sed -n 's/^fact //p')  # not what torch printed as it imported
gpus=$(echo "$about" | sed -n 1p) header=$(echo "$about" | sed -n 2p)
strategy_names=$(echo "$about" | sed -n 3p) xdist=$(echo "$about" | sed -n 4p)

if [ $mode = gpu ] && [ $plan = 0 ]; then
  [[ $gpus =~ ^[0-9]+$ ]] || { echo "gpu_check.sh: torch.cuda failed: $gpus" >&2; exit 2; }
  [ "$gpus" -ge 1 ] || { echo "no CUDA GPU visible; use --cpu" >&2; exit 2; }
else
  gpus=1
fi
if [ $mode = gpu ]; then
  where=()
  small=(--data synthetic --train-limit 4096 --test-limit 1000 --epochs 2 --batch-size 256
         --comm-probe-steps 0)
  narrow=(--width 0.25)
  full=(--data synthetic --train-limit 50000 --test-limit 10000 --batch-size 512)
  sweep_workers=0,2,4,8,12
  verify_size=()
  selftest_size=()
  shared=$([ "$gpus" -ge 2 ] && echo "" || echo "--backend gloo")  # 2 ranks on one GPU
else
  where=(--cpu)
  small=(--data synthetic --train-limit 128 --test-limit 16 --epochs 2 --batch-size 32
         --comm-probe-steps 0)
  narrow=(--width 0.125)
  full=(--data synthetic --train-limit 256 --test-limit 64 --width 0.125 --batch-size 64)
  sweep_workers=0,2
  # verify's float64 ranks at the suite's size (tests/test_verify.py): 16 px, 1/8 width (at
  # its default size the check took 156 s of a core, 46 s so). Not the fp16 hook's self-test:
  # at 16 px its unbroken run exceeds the hook's tolerance (7.7e-5 against 3e-5). One
  # strategy: the test verifies every CPU strategy, with margins, in the same CI run (all
  # of them here took 65 s more of a core for a second pass/fail of the same runs)
  verify_size=(--width 0.125 --batch-size 64 --image-size 16 --strategies ddp)
  # the fp16 hook's self-test at half the global batch (64), 32 px, 10 steps: unbroken
  # 7.1e-7 / 3.9e-6 against its 1e-5 / 2e-5, the defects 9.3e-5 / 2.1e-4 and more (at the
  # lease's 30 steps 1.2e-5 / 2.0e-5 against 3e-5 / 6e-5: less margin, twice the time:
  # 73 CPU-s against 39, 2026-11-28)
  selftest_size=(--batch-size 64 --steps 10)
  shared=
fi

if [ $plan = 0 ]; then
  mkdir -p "$out/state" && out=$(cd "$out" && pwd)
  summary=$out/summary-$phase${items:+-$(echo "$items" | tr -c 'A-Za-z0-9_.\n-' '_')}.txt
  : > "$summary"
  export PYTHONPATH="$out/site:$PYTHONPATH" PATH="$out/site/bin:$PATH"
fi
passed=0 failed=0 skipped=0 deferred=0 earlier=0 planned=0
say() {
  if [ $commands = 1 ]; then return 0; fi
  if [ $plan = 1 ]; then echo "$1"; else echo "$1" | tee -a "$summary"; fi
}

# Phase `next`: what the first check (one H100, 2026-11-23) left, for a 30-minute lease (~24 min
# with the start; scripts/gpu_lease.py picks from it what fits 15 minutes): the
# builds a fresh machine needs, every item that never passed on a GPU (Horovod, the variants,
# the deferred fastest path and throughput, the GPU tests cut by the item limit, now with the
# GPU clock checks), a profiler trace again (the variants' report then shows its Holistic
# Trace Analysis breakdown from a real CUDA trace), and fsdp and the fastest path again at
# full size: their step times drifted between epochs; records now carry each epoch's clocks.
# And the fastest path with CUDA graphs (--compile reduce-overhead): its step times varied
# as a host-bound loop's do (11.2 to 15.0 ms), so launch overhead may be what is left.
# And bf16 with the DataLoader again: the --loader torch rows but fsdp's trained at 18,900 to
# 24,000 img/s whatever their precision; records now measure the input pipeline alone (input-bound or not),
# and `bench loader` measures it at 0 to 12 workers first: how many the table's rows need.
next_items='^(build_.*|pytest_gpu|n1_horovod|profile_trace|fastest_path|throughput|table_(loader_sweep|horovod|fsdp|ddp-amp_bf16|fastest|fastest_graphs|report))$'

# item PHASE NAME ESTIMATE_S CMD...: run unless another phase, passed before, or over budget.
# Exit 3 (strategy unavailable) is a skip with the reason; the log is OUTDIR/NAME.log.
item() {
  local item_phase=$1 name=$2 estimate=$3; shift 3
  [ "$phase" = all ] || [ "$phase" = "$item_phase" ] ||
    { [ "$phase" = next ] && { [ "$item_phase" = variants ] || [[ $name =~ $next_items ]]; }; } ||
    return 0
  [ -z "$items" ] || [[ $name =~ $items ]] || return 0
  [ $mode = cpu ] && estimate=$((estimate * 2))  # tiny sizes, but 2 slow cores
  if [ $commands = 1 ]; then
    printf '%s %s\t' "$item_phase" "$name"; printf '%q ' "$@"; printf '\n'; return 0
  fi
  if [ $plan = 1 ]; then
    printf '%-10s %-26s ~%4ss\n' "$item_phase" "$name" "$estimate"
    planned=$((planned + estimate)); return 0
  fi
  if [ $again = 0 ] && [ -f "$out/state/$name.pass" ]; then
    say "done  $name (passed earlier, $(cat "$out/state/$name.pass")s)"
    earlier=$((earlier + 1)); return 0
  fi
  local cost=$estimate
  [ -f "$out/state/$name.secs" ] && cost=$(cat "$out/state/$name.secs")
  if [ "$budget" -gt 0 ] && [ $((SECONDS + cost)) -gt "$budget" ]; then
    say "defer $name (~${cost}s would pass the ${budget}s budget at ${SECONDS}s)"
    deferred=$((deferred + 1)); return 0
  fi
  # A hung item ends; it cannot eat the lease: at 4x its cost, or CHECK_GRACE seconds (30)
  # after the budget, whichever comes first.
  local start=$SECONDS rc limit=$((4 * cost + 120)) why=
  if [ "$budget" -gt 0 ] && [ $((budget + grace - SECONDS)) -lt $limit ]; then
    limit=$((budget + grace - SECONDS)) why=" (${grace}s past the ${budget}s budget)"
  fi
  timeout -k 10 "$limit" "$@" > "$out/$name.log" 2>&1
  rc=$? secs=$((SECONDS - start))
  [ $rc -eq 124 ] && echo "gpu_check.sh: killed after ${limit}s$why" >> "$out/$name.log"
  echo "$secs" > "$out/state/$name.secs"
  if [ $rc -eq 0 ]; then
    say "pass  $name (${secs}s)"; passed=$((passed + 1)); echo "$secs" > "$out/state/$name.pass"
  elif [ $rc -eq 3 ]; then
    say "skip  $name (${secs}s): $(grep -m1 'unavailable here' "$out/$name.log" | cut -c1-150)"
    skipped=$((skipped + 1))
  else
    local how="exit $rc"
    [ $rc -eq 124 ] && how="killed after ${limit}s$why"
    say "FAIL  $name ($how, ${secs}s, log $out/$name.log)"; failed=$((failed + 1))
    tail -n 5 "$out/$name.log" | sed 's/^/      | /' | tee -a "$summary"
  fi
}
# An item the CPU refuses by design (fp16 needs CUDA): skipped on CPU with its reason, not
# run there to fail.
skip_on_cpu() {
  local item_phase=$1 name=$2 why=$3
  [ "$phase" = all ] || [ "$phase" = "$item_phase" ] || return 0
  [ -z "$items" ] || [[ $name =~ $items ]] || return 0
  [ $plan = 1 ] && return 0
  say "skip  $name: $why"; skipped=$((skipped + 1))
}
# The commands items run (arrays, not functions: `timeout` runs them).
model_run=("$py" -m bench run "${where[@]}" --no-progress --output "$out/results" "${small[@]}")
small_run=("${model_run[@]}" "${narrow[@]}")  # resnet18-cifar narrowed; other models take no --width
full_runs() {  # the table's runs, at the worker count decided for them
  full_run=("$py" -m bench run "${where[@]}" --no-progress --output "$out/table" "${full[@]}"
            ${table_workers:+--workers "$table_workers"})
}

if [ $plan = 0 ]; then
  say "parallel-bench check ($mode, phase $phase) $(date -u +%FT%TZ): $header"
else
  say "parallel-bench check plan ($mode): seconds per item on one H100, as measured 2026-11-23 (items run
side by side took longer; build_horovod and the variants phase are estimates: they have not run there yet)"
fi

# --- build: Horovod (NCCL) and apex 25.05 from the carried sources, into OUTDIR/site --------
if [ -z "$deps" ] && [ $plan = 0 ] && [ $mode = gpu ] && { [ "$phase" = build ] ||
   [ "$phase" = next ] || [ "$phase" = all ]; }; then
  say "no --deps DIR: Horovod and apex are not built (their items say unavailable); carry \
.cache/gpu-deps (make gpu-deps GPU_PYTHON=3.12) and add --deps .cache/gpu-deps"
fi
if [ -n "$deps" ] || [ $plan = 1 ]; then
  built=${deps:-DIR}/built
  item build build_horovod 200 env HOROVOD_WHEEL_CACHE="$built/horovod" "$py" \
    scripts/build_horovod.py --wheelhouse "$deps/horovod-wheelhouse" --target "$out/site"
  apex_src=$(ls -d "${deps:-/nonexistent}"/apex-25.05* 2>/dev/null | head -1)
  item build build_apex 140 env APEX_SRC="${apex_src:-missing}" \
    APEX_WHEEL_CACHE="$built/apex" "$py" scripts/build_apex.py --target "$out/site"
fi

# --- core: the GPU tests, every strategy at N=1, 2 ranks (sharing one GPU), verify ----------
# With pytest-xdist (the GPU machine's image has it) the GPU tests run 4 at a time: each is one
# small launch-bound run, and 15 of them one after another take 6 minutes of a lease.
if [ "$xdist" = 1 ]; then
  side_by_side=(-n "${PYTEST_GPU_WORKERS:-4}") pytest_estimate=150
else
  side_by_side=() pytest_estimate=360
fi
[ $mode = gpu ] && item core pytest_gpu $pytest_estimate "$py" -m pytest -v -rfEs -p no:cacheprovider \
  "${side_by_side[@]}" -m gpu tests
for s in $strategy_names; do
  item core "n1_$s" 25 "${small_run[@]}" --strategy "$s" --gpus 1
done
# Sharing one GPU (gloo) leaves out fsdp (refused: its gloo collectives on CUDA tensors
# crashed) and horovod (CUDA tensors over gloo need a build without NCCL GPU ops).
two_rank="ddp ddp-amp ddp-apex"
[ -n "$shared" ] || two_rank="$two_rank fsdp horovod"
# shellcheck disable=SC2086  # $shared is empty or two words
for s in $two_rank; do item core "n2_$s" 30 "${small_run[@]}" --strategy "$s" --gpus 2 $shared; done
# shellcheck disable=SC2086
item core verify 120 "$py" -m bench verify "${where[@]}" "${verify_size[@]}" --gpus 2 $shared

# --- options: precisions, loaders, memory format, optimizer, compile ------------------------
if [ $mode = gpu ]; then
  item options precision_fp16 30 "${small_run[@]}" --strategy ddp-amp --gpus 1 --precision fp16
  item options precision_tf32_off 30 "${small_run[@]}" --strategy ddp --gpus 1 --tf32 off
  item options precision_apex_o2 30 "${small_run[@]}" --strategy ddp-apex --gpus 1 --apex-opt-level O2
  item options workers4_pinned 30 "${small_run[@]}" --strategy ddp --gpus 1 --workers 4
  item options profile_trace 30 "${small_run[@]}" --strategy ddp --gpus 1 --profile-steps 5
fi
item options precision_bf16 30 "${small_run[@]}" --strategy ddp-amp --gpus 1 --precision bf16
item options loader_gpu 30 "${small_run[@]}" --strategy ddp --gpus 1 --loader gpu
item options channels_last 30 "${small_run[@]}" --strategy ddp --gpus 1 --channels-last
item options fused_sgd 30 "${small_run[@]}" --strategy ddp --gpus 1 --optimizer-impl fused
item options compile 60 "${small_run[@]}" --strategy ddp --gpus 1 --compile --epochs 1
item options fastest_path 90 "${small_run[@]}" --strategy ddp-amp --gpus 1 --precision bf16 --loader gpu \
  --channels-last --optimizer-impl fused --compile
if [ $mode = gpu ]; then
  item options throughput 60 "$py" benchmarks/throughput.py --strategies ddp,ddp-amp --gpus 1 \
    --output "$out/throughput"
fi
item options report 10 "$py" -m bench report --results "$out/results"

# --- variants: what a run can change beyond the table's strategies (added after the first
# GPU check): FSDP's mixed precision and resharding, DDP's gradient compression hooks (NCCL
# runs torch's asynchronous PowerSGD; gloo one bucket at a time), other models -------------
item variants fsdp_bf16 30 "${small_run[@]}" --strategy fsdp --gpus 1 --precision bf16
[ $mode = gpu ] && item variants fsdp_fp16 30 "${small_run[@]}" --strategy fsdp --gpus 1 --precision fp16
item variants fsdp_no_reshard 30 "${small_run[@]}" --strategy fsdp --gpus 1 --no-reshard-after-forward
item variants hook_fp16 30 "${small_run[@]}" --strategy ddp --gpus 1 --ddp-comm-hook fp16
item variants hook_powersgd 30 "${small_run[@]}" --strategy ddp --gpus 1 --ddp-comm-hook powersgd
[ $mode = gpu ] && item variants hook_fp16_apex_torch 30 "${small_run[@]}" --strategy ddp-apex --gpus 1 \
  --apex-ddp torch --ddp-comm-hook fp16
# 2 ranks with the comm probe: the hook's own work measured on a DDP of each rank alone
# shellcheck disable=SC2086
item variants hook_powersgd_n2 30 "${small_run[@]}" --strategy ddp --gpus 2 $shared \
  --ddp-comm-hook powersgd --comm-probe-steps 5
item variants zero_bf16 30 "${small_run[@]}" --strategy ddp-zero --gpus 1 --precision bf16
item variants model_resnet50 40 "${model_run[@]}" --strategy ddp --gpus 1 --model torchvision:resnet50 \
  --image-size 64
item variants model_user 30 env PYTHONPATH="tests/data:$PYTHONPATH" "${model_run[@]}" --strategy ddp \
  --gpus 1 --model user_models:tiny_cnn
# The fp16 hook's self-test needs 30 steps to catch the exchange's defects (docs/verify.md):
# too long for make test, so it runs here (on CPU in the long tier, and on the GPU).
# shellcheck disable=SC2086
item variants selftest_hook_fp16 45 "$py" -m bench verify "${where[@]}" --gpus 2 $shared \
  --self-test --strategies ddp --ddp-comm-hook fp16 --defects sum-gradients,skip-allreduce \
  --steps 30 "${selftest_size[@]}"
# bench probe's contention on CUDA (the compute timed on its own stream while gloo or NCCL
# all-reduces its gradient): over gloo on one GPU its ranks share the device, which is the
# path's run, not a figure (the table's probe needs 2 GPUs)
# shellcheck disable=SC2086
item variants probe_contention 30 "$py" -m bench probe "${where[@]}" --gpus 2 $shared "${narrow[@]}" \
  --max-size 1 --output "$out/results"
item variants variants_report 10 "$py" -m bench report --results "$out/results"

# --- table: the README's GPU rows (N=1, 50,000 synthetic images, full width, batch 512) -----
# First the input pipeline alone at several worker counts: whether the DataLoader rows' default
# (4 per GPU) feeds faster than the model trains.
# Its figures are also kept as JSON in OUTDIR/table_loader_sweep.json (TABLE_WORKERS=auto reads them).
sweep_json=$out/table_loader_sweep.json
item table table_loader_sweep 40 bash -c 'set -o pipefail; "$@" --format json | tee "$0"' "$sweep_json" \
  "$py" -m bench loader "${where[@]}" "${full[@]}" --strategy ddp --gpus 1 --workers "$sweep_workers"
per=$([ $mode = gpu ] && echo GPU || echo replica)
if [ $plan = 0 ] && [[ $phase =~ ^(table|calibrate|all|next)$ ]]; then
  # What the sweep measured, in the summary; TABLE_WORKERS=auto: the fewest workers per
  # replica that fed within 10 % of the best count's img/s.
  picked=$("$py" - "$sweep_json" 2> /dev/null <<'PICK'
import json, sys
points = json.load(open(sys.argv[1]))["points"]
best = max(p["images_per_s"] for p in points)
print(", ".join(f"{p['workers_per_replica']}: {p['images_per_s']:,.0f} img/s" for p in points))
print(min(p["workers_per_replica"] for p in points if p["images_per_s"] >= 0.9 * best))
PICK
) || picked=
  [ -n "$picked" ] && say "loader alone, workers per $per: $(echo "$picked" | head -1)"
  if [ "$table_workers" = auto ]; then
    table_workers=$(echo "$picked" | sed -n 2p)
    if [ -n "$table_workers" ]; then
      say "table workers: $table_workers per $per (TABLE_WORKERS=auto: the fewest within 10 % of the best count)"
    else
      say "table workers: bench run's default (TABLE_WORKERS=auto, but no loader sweep figures in $sweep_json)"
    fi
  fi
fi
[ "$table_workers" = auto ] && table_workers=  # --plan, or no table in this phase: the default
full_runs
for s in dp ddp ddp-spawn ddp-launch fsdp horovod ddp-apex; do
  item table "table_$s" 50 "${full_run[@]}" --strategy "$s" --gpus 1 --epochs 4
done
if [ $mode = gpu ]; then
  item table table_ddp-amp_fp16 45 "${full_run[@]}" --strategy ddp-amp --gpus 1 --epochs 4 \
    --precision fp16
else
  skip_on_cpu table table_ddp-amp_fp16 "--precision fp16 needs CUDA (the CPU refuses it by design)"
fi
item table table_ddp-amp_bf16 45 "${full_run[@]}" --strategy ddp-amp --gpus 1 --epochs 4 --precision bf16
item table table_fastest 70 "${full_run[@]}" --strategy ddp-amp --gpus 1 --epochs 6 --precision bf16 \
  --loader gpu --channels-last --optimizer-impl fused --compile
item table table_fastest_graphs 80 "${full_run[@]}" --strategy ddp-amp --gpus 1 --epochs 6 \
  --precision bf16 --loader gpu --channels-last --optimizer-impl fused --compile reduce-overhead
# The all-reduce probe needs 2 ranks with a device each (over gloo on one GPU it measures
# host copies, not a link).
[ "$gpus" -ge 2 ] && item table table_probe 30 "$py" -m bench probe "${where[@]}" --gpus 2 \
  --output "$out/table"
item table table_report 10 "$py" -m bench report --results "$out/table"

# --- calibrate: epochs to 50 % / 60 % top-1 on the synthetic set, difficulty 1.0 and 0.5 ----
for d in 1.0 0.5; do
  item calibrate "calibrate_d$d" 80 "${full_run[@]}" --output "$out/calibrate" \
    --strategy ddp-amp --gpus 1 --precision bf16 --loader gpu --channels-last \
    --optimizer-impl fused --epochs 30 --target-top1 60 --synthetic-difficulty "$d"
done

if [ $plan = 1 ]; then
  say "total ~${planned}s for phase $phase (add ~90 s for a fresh machine's start)"
  exit 0
fi
say "parallel-bench check ($phase): $passed passed, $failed failed, $skipped skipped, \
$deferred deferred, $earlier passed earlier; ${SECONDS}s"
[ $failed -eq 0 ]
