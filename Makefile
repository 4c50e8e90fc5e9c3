# parallel-bench: `make demo` and `make test` work on a fresh clone (CPU is enough).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO   ?= results/demo
# Demo workload: the real ResNet-18 on a small synthetic set, the README's CPU workload:
# a probe of the all-reduce, the 1-process baseline, then ddp and ddp-amp on 2 CPU processes
# (ddp-spawn and ddp-launch start the same DDP another way: on CPU they repeat ddp's row);
# then every command on its folder: report (with its verdict), project (over the probe's
# network) and compare (against the committed results). About 4 min on 2 cores of the
# table's CPU, 7 on one that trains half as fast, the install included.
# 1,536 images are too few for the default (hard) synthetic set: the easy one (difficulty 0).
# ddp-amp trains bf16 on CPU: the demo, table and parity rules leave it out, saying so, where
# the CPU has no bf16 arithmetic (AVX2 alone: emulated, 24x slower than fp32: an hour in the
# demo, hours in parity), unless BF16=yes (DEMO_BF16=yes, its older name, for the demo).
BF16 ?= auto
DEMO_BF16 ?= $(BF16)
comma := ,
empty :=
space := $(empty) $(empty)
# no where the CPU has no bf16 arithmetic, else yes (asked once, when a rule first needs it,
# after the install: bench answers with torch's own query)
BF16_HERE = $(eval BF16_HERE := $(shell $(BIN)/python -c "from bench.records.environment \
  import cpu_bf16_instructions as f; print('no' if f() is False else 'yes')"))$(BF16_HERE)
# "no" (ddp-amp left out) where bf16 is emulated here and not asked for (BF16=yes), else ""
AMP_OFF = $(filter no,$(if $(filter yes,$(1)),yes,$(BF16_HERE)))
AMP_LEFT_OUT = echo "$@: ddp-amp left out: this CPU has no bf16 arithmetic (see \`bench list\`), and"; \
  echo "  emulated bf16 would take an hour or more here; make $@ BF16=yes runs it anyway"
DEMO_ARGS ?= --cpu --data synthetic --synthetic-difficulty 0 --train-limit 1536 --test-limit 512 \
             --epochs 3 --target-top1 90 --batch-size 64 --output $(DEMO)

# The README's comparison table: every strategy on the same CPU workload, then (as root) the
# strategies across two network namespaces joined by a 1 Gbit/s link (benchmarks/
# testbed_table.py: a communication-bound block of its own), then the report.
# Measured into TABLE_NEW, then they replace the table's earlier runs in results/ (the GPU and
# parity rows stay).
TABLE_NEW  ?= results/.table-new
TABLE_ARGS ?= --cpu --data synthetic --synthetic-difficulty 0 --train-limit 1536 --test-limit 512 \
              --epochs 3 --target-top1 90 --batch-size 64 --no-progress --output $(TABLE_NEW)
# Accuracy parity and time to target over 5 seeds, on a workload whose accuracy does not
# saturate (12,288 images of difficulty 0.5, ResNet-18 x0.125; about 20 min on 2 cores).
PARITY_ARGS ?= --cpu --data synthetic --synthetic-difficulty 0.5 --train-limit 12288 \
               --test-limit 1000 --epochs 5 --batch-size 256 --width 0.125 --target-top1 50 \
               --repeats 5 --no-progress --output results
TABLE_STRATEGIES ?= dp ddp ddp-spawn ddp-launch ddp-amp fsdp horovod ddp-apex
# The table's rows again, 3 runs each (`make table-repeats`): whether rows one run each
# cannot tell apart differ. Its own folder, the table's workload (TABLE_ARGS less its folder).
REPEATS_OUT ?= results/cpu-table-repeats
REPEATS_ARGS = $(filter-out --output $(TABLE_NEW),$(TABLE_ARGS)) --output $(REPEATS_OUT)

.PHONY: install demo table table-repeats parity parity-powersgd parity-d05 test test-long test-fast lint horovod apex gpu-deps gpu-venv gpu-wheels \
        gpu-ready clean slurm-up slurm-down

# The install needs 6 GiB at its peak: refused in one line where the disk lacks 7.
INSTALL_GIB ?= 7
$(STAMP): pyproject.toml
	@$(PYTHON) scripts/check_space.py $(VENV) $(INSTALL_GIB)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-compile -e '.[dev]'
	@# the bytecode on every core (pip compiles on one: 120 s became 95 here), bench's too
	@# (a process started with PYTHONDONTWRITEBYTECODE would compile it each time); a file
	@# that does not compile (some packages ship such test data) is skipped, as pip skips it
	$(BIN)/python -m compileall -q -j 0 bench strategies $$($(BIN)/python -c \
	  "import sysconfig; print(sysconfig.get_paths()['purelib'])") > /dev/null || true
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	rm -rf $(DEMO)
	$(BIN)/bench list
	$(BIN)/bench probe --cpu --gpus 2 --output $(DEMO)
	$(BIN)/bench run --strategy ddp --gpus 1 $(DEMO_ARGS)
	$(BIN)/bench run --strategy ddp --gpus 2 $(DEMO_ARGS)
	$(if $(call AMP_OFF,$(DEMO_BF16)),@$(AMP_LEFT_OUT),$(BIN)/bench run \
	  --strategy ddp-amp --gpus 2 $(DEMO_ARGS))
	$(BIN)/bench report --results $(DEMO)
	$(BIN)/bench project $(DEMO) --network probe --gpus 8,64
	@echo "bench compare results $(DEMO): the committed CPU rows against yours"
	@echo "  (on another CPU: a new machine, A → B; exit 1: a row regressed)"
	-$(BIN)/bench compare results $(DEMO)

# Horovod 0.28.1 built from source for the installed torch (C++ standard raised, Gloo, no MPI):
# fills .cache/horovod-wheelhouse (the only step that downloads; skipped when full), then
# builds with the package index off.
horovod: $(STAMP)
	$(BIN)/python scripts/build_horovod.py

# NVIDIA apex 25.05 from its source (APEX_SRC=DIR|TARBALL, else git clone of the tag):
# CUDA extensions when it can, else the C++ one, else Python only.
apex: $(STAMP)
	$(BIN)/python scripts/build_apex.py

# What a GPU machine without network needs, in one folder to carry there (APEX_SRC: a tarball
# of apex 25.05; APEX_GIT: a git mirror of NVIDIA/apex holding the tag; else it is cloned):
# scripts/gpu_check.sh --deps $(GPU_DEPS) OUTDIR builds both offline.
GPU_DEPS ?= .cache/gpu-deps
GPU_PYTHON ?= 3.12
gpu-deps: $(STAMP)
	$(BIN)/python scripts/build_horovod.py --fill-only --python-version $(GPU_PYTHON) \
	  --wheelhouse $(GPU_DEPS)/horovod-wheelhouse
	if [ -n "$(APEX_SRC)" ]; then cp "$(APEX_SRC)" $(GPU_DEPS)/apex-25.05.tar.gz; \
	elif [ -n "$(APEX_GIT)" ]; then git --git-dir="$(APEX_GIT)" archive --prefix=apex-25.05/ \
	  -o $(abspath $(GPU_DEPS))/apex-25.05.tar.gz 25.05; else \
	  rm -rf $(GPU_DEPS)/apex-clone && \
	  git clone --quiet --depth 1 --branch 25.05 https://github.com/NVIDIA/apex $(GPU_DEPS)/apex-clone && \
	  git -C $(GPU_DEPS)/apex-clone archive --prefix=apex-25.05/ \
	    -o $(abspath $(GPU_DEPS))/apex-25.05.tar.gz HEAD && rm -rf $(GPU_DEPS)/apex-clone; fi
	$(BIN)/python scripts/carry_size.py $(GPU_DEPS)

# Before a lease: the GPU check's build phase, run here with the GPU machine's Python and
# torch, fills $(GPU_DEPS)/built so that its build items there install cached wheels instead
# of compiling (Horovod ~200 s, apex ~140 s of a 15-minute lease), stripped of debug sections
# so that the folder fits a call's 64 MiB (carry_size.py checks). GPU_PYTHON_BIN: an
# interpreter with that Python and torch; by default $(GPU_VENV), which `make gpu-venv` makes
# from a Python $(GPU_PYTHON) found here (on PATH or pyenv's) and the registry's torch. nvcc on
# PATH: they cross-compile for sm_90 (Horovod in GPU mode though no GPU is here). The wheels
# are used only where torch, Python (and, for apex, nvcc) match.
GPU_VENV ?= .cache/gpu-venv
GPU_TORCH ?= torch==2.11.0
GPU_PYTHON_BIN ?= $(GPU_VENV)/bin/python
$(GPU_VENV)/.installed:
	@py=; for c in python$(GPU_PYTHON) $$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/$(GPU_PYTHON).*/bin/python$(GPU_PYTHON) 2>/dev/null | sort -V -r); do \
	  $$c -c pass > /dev/null 2>&1 && { py=$$c; break; }; done; \
	[ -n "$$py" ] || { echo "make gpu-venv: no Python $(GPU_PYTHON) here (the GPU machine's): install one, or set GPU_PYTHON_BIN to an interpreter with $(GPU_TORCH)"; exit 2; }; \
	echo "$$py -m venv $(GPU_VENV)"; $$py -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/python -m pip install --quiet $(GPU_TORCH) numpy  # apex imports numpy; the GPU machine has it
	touch $@

gpu-venv: $(GPU_VENV)/.installed

gpu-wheels: $(if $(filter $(GPU_VENV)/bin/python,$(GPU_PYTHON_BIN)),$(GPU_VENV)/.installed)
	rm -rf build/gpu-wheels
	HOROVOD_BUILD_MODE=gpu PYTHON=$(abspath $(GPU_PYTHON_BIN)) scripts/gpu_check.sh --cpu \
	  --deps $(GPU_DEPS) --phase build build/gpu-wheels
	$(BIN)/python scripts/carry_size.py $(GPU_DEPS)

# Everything a 15-minute lease needs, made here (~10 min on 2 cores): the sources, the GPU
# machine's torch, both wheels; then the lease's plan. Carry $(GPU_DEPS) and run
# `python3 scripts/gpu_lease.py --deps $(GPU_DEPS) /tmp/check $$OUT` (docs/gpus.md).
gpu-ready: gpu-deps
	$(MAKE) --no-print-directory gpu-wheels
	$(BIN)/python scripts/gpu_lease.py --plan --deps $(GPU_DEPS)

table: $(STAMP)
	rm -rf $(TABLE_NEW)
	$(BIN)/bench probe --cpu --gpus 2 --output $(TABLE_NEW)
	$(BIN)/bench run --strategy ddp --gpus 1 $(TABLE_ARGS)
	$(if $(call AMP_OFF,$(BF16)),$(if $(filter ddp-amp,$(TABLE_STRATEGIES)),@$(AMP_LEFT_OUT)))
	for s in $(if $(call AMP_OFF,$(BF16)),$(filter-out ddp-amp,$(TABLE_STRATEGIES)),$(TABLE_STRATEGIES)); do \
	  $(BIN)/bench run --strategy $$s --gpus 2 $(TABLE_ARGS) || echo "$$s exited $$?"; \
	done
	$(BIN)/bench run --strategy ddp --gpus 2 --grad-accum 4 $(TABLE_ARGS)
	$(BIN)/python benchmarks/testbed_table.py $(TABLE_ARGS) || \
	  echo "the block over the shaped link was not measured (above; root only)"
	$(BIN)/python scripts/replace_rows.py $(TABLE_NEW) results
	$(BIN)/bench report --results results --update-readme
	@# the projection's validation kept in results/ covers its runs again (a test checks)
	$(BIN)/bench project results --validate > /dev/null

# The CPU table's rows (but apex, which needs CUDA), 3 runs each, in rounds: each round adds
# one run of every row, so that a slow spell of the machine falls on every row alike, not on
# one row's runs. About 66 min on 2 cores (2026-12-03); it resumes where it was stopped.
table-repeats: $(STAMP)
	$(if $(call AMP_OFF,$(BF16)),$(if $(filter ddp-amp,$(TABLE_STRATEGIES)),@$(AMP_LEFT_OUT)))
	for r in 1 2 3; do \
	  $(BIN)/bench sweep --strategies ddp --gpus 1 --repeats $$r $(REPEATS_ARGS) && \
	  $(BIN)/bench sweep --strategies $(subst $(space),$(comma),$(strip $(filter-out ddp-apex \
	    $(if $(call AMP_OFF,$(BF16)),ddp-amp),$(TABLE_STRATEGIES)))) --gpus 2 --repeats $$r \
	    $(REPEATS_ARGS) && \
	  $(BIN)/bench sweep --strategies ddp --gpus 2 --grad-accum 4 --repeats $$r $(REPEATS_ARGS) \
	  || exit 1; \
	done
	$(BIN)/bench report --results $(REPEATS_OUT)

# Does it cost accuracy at N = 1, 2, 4, 8 replicas: the calibrated parity workload (docs/parity.md,
# bench/commands/parity.py WORKLOAD; seeds agree to 0.25 points), 3 seeds a row (95 % CI about
# ±0.6 points), in order of what matters most if it is stopped (each sweep resumes): ddp with
# per-replica BN, ddp with SyncBN (--cpu-syncbn), ddp-amp bf16 (SyncBN), then at N=8 the
# strategies and hooks that change the math. Ranks oversubscribe the cores: only top-1 counts.
# 73 min on 2 cores, alone (4,362 s, 2026-11-27); PARITY_OUT=folder measures elsewhere.
PARITY_OUT ?= results
# the workload's options from bench parity's own list (one source), read when the rule runs
PARITY_WORKLOAD = $(shell $(BIN)/python -c \
  "from bench.commands.parity import WORKLOAD; print(' '.join(WORKLOAD))")
PARITY_N_ARGS ?= $(PARITY_WORKLOAD) --repeats 3 --output $(PARITY_OUT)
parity: $(STAMP)
	$(BIN)/bench sweep --strategies ddp --gpus 1,2,4,8 $(PARITY_N_ARGS)
	$(BIN)/bench sweep --strategies ddp --gpus 2,4,8 --cpu-syncbn $(PARITY_N_ARGS)
	$(if $(call AMP_OFF,$(BF16)),@$(AMP_LEFT_OUT),$(BIN)/bench sweep \
	  --strategies ddp-amp --gpus 1 $(PARITY_N_ARGS))
	$(if $(call AMP_OFF,$(BF16)),,$(BIN)/bench sweep --strategies ddp-amp \
	  --gpus 2$(comma)4$(comma)8 --cpu-syncbn $(PARITY_N_ARGS))
	$(BIN)/bench sweep --strategies fsdp,ddp-zero,horovod --gpus 8 $(PARITY_N_ARGS)
	$(BIN)/bench sweep --strategies ddp --gpus 8 --ddp-comm-hook fp16 $(PARITY_N_ARGS)
	$(BIN)/bench sweep --strategies ddp --gpus 8 --ddp-comm-hook powersgd $(PARITY_N_ARGS)
	$(BIN)/bench report --results $(PARITY_OUT) $(if $(filter results,$(PARITY_OUT)),--update-readme)
	$(if $(filter results,$(PARITY_OUT)),$(BIN)/bench project results --validate > /dev/null)

# The PowerSGD row settled: 3 seeds left it "not settled" (every run 13-28 points below ddp
# N=1, yet Welch's p 0.068, one run 15 points from the other two), so 8 seeds of it and of
# its reference (ddp N=1); where `make parity` ran, its seeds 0-2 are kept and 3-7 added.
# About 21 min on 2 cores (1,232 s for the 16 runs, AMD EPYC, 2026-12-03).
parity-powersgd: $(STAMP)
	$(BIN)/bench sweep --strategies ddp --gpus 8 --ddp-comm-hook powersgd $(PARITY_WORKLOAD) \
	  --repeats 8 --output $(PARITY_OUT)
	$(BIN)/bench sweep --strategies ddp --gpus 1 $(PARITY_WORKLOAD) --repeats 8 --output $(PARITY_OUT)
	$(BIN)/bench report --results $(PARITY_OUT) $(if $(filter results,$(PARITY_OUT)),--update-readme)
	$(if $(filter results,$(PARITY_OUT)),$(BIN)/bench project results --validate > /dev/null)

# The committed d=0.5 parity block (5 seeds at N=1 and 2; its CIs are ±13 points wide).
parity-d05: $(STAMP)
	$(BIN)/bench sweep --strategies ddp --gpus 1 $(PARITY_ARGS)
	$(if $(call AMP_OFF,$(BF16)),@$(AMP_LEFT_OUT))
	$(BIN)/bench sweep --strategies dp,ddp$(if $(call AMP_OFF,$(BF16)),,$(comma)ddp-amp) \
	  --gpus 2 $(PARITY_ARGS)
	$(BIN)/bench report --results results --update-readme
	$(BIN)/bench project results --validate > /dev/null

# A real one-node Slurm on this machine (root; Debian: apt-get install slurm-wlm munge), to
# try `bench slurm` and `bench sweep --slurm` before a cluster; stop it with slurm-down.
SLURM_LOCAL ?= /tmp/bench-slurm
slurm-up:
	python3 scripts/slurm_local.py up $(SLURM_LOCAL)

slurm-down:
	python3 scripts/slurm_local.py down $(SLURM_LOCAL)

lint: $(STAMP)
	$(BIN)/ruff check .

# `make test` builds Horovod for this machine (scripts/build_horovod.py: NCCL operations where
# a GPU is visible, CPU-only otherwise; about 2 minutes from an empty cache on 2 cores, where
# cross-compiling the sm_90 operations took 3.7): the tests run it over gloo. The GPU
# machine's own wheel (its Python and torch) is `make gpu-ready`'s, before a lease;
# HOROVOD_TEST_MODE=gpu cross-compiles the sm_90 operations here too.
HOROVOD_TEST_MODE ?=
# The suite runs on 2 workers (tests that share a fixture's runs on one), then the tests
# marked serial (a neighbour's load would move their figures, or they look for processes
# machine-wide) alone. `make test` is the gate (12 minutes on 2 cores); `make test-long`
# the rest: other strategies on the same paths, statistical power, Slurm arrays, sweeps
# killed and resumed (tests/tiers.py says which and why).
# Each part names its 10 slowest tests. TIER=all runs both tiers in one pass: one parallel
# phase (the minutes-long tests handed out first: tests/tiers.py FIRST), then one serial,
# instead of two of each. TIER=K/N (CI: .ci/run) runs the gate and the K-th of N shares of
# the long tier (tests/tiers.py SHARES) in the same way.
TIER ?= gate
TIER_SHARE := $(if $(findstring /,$(TIER)),$(TIER))
ifneq ($(words $(filter $(TIER),gate all $(TIER_SHARE))),1)
$(error TIER=$(TIER): use TIER=gate (the default), TIER=all, or TIER=K/N (a share of the long tier))
endif
TIER_MARK := $(if $(filter gate,$(TIER)),and not long)
PYTEST := $(BIN)/python -m pytest --durations=10 $(if $(TIER_SHARE),--long-share $(TIER_SHARE))
test: $(STAMP) lint
	HOROVOD_BUILD_MODE=$(HOROVOD_TEST_MODE) $(MAKE) --no-print-directory horovod
	$(PYTEST) -n 2 --dist loadgroup -m "not serial $(TIER_MARK)" && \
	  $(PYTEST) -m "serial $(TIER_MARK)"

test-long: $(STAMP)
	HOROVOD_BUILD_MODE=$(HOROVOD_TEST_MODE) $(MAKE) --no-print-directory horovod
	$(PYTEST) -n 2 --dist loadgroup -m "long and not serial" && $(PYTEST) -m "long and serial"

# The gate without building Horovod (its tests are then skipped with the reason).
test-fast: $(STAMP) lint
	$(PYTEST) -n 2 --dist loadgroup -m "not serial and not long" && \
	  $(PYTEST) -m "serial and not long"

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache results/demo build .cache
