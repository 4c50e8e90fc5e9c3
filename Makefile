# parallel-bench: `make demo` and `make test` work on a fresh clone (CPU is enough).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO   ?= results/demo
# Demo workload: the real ResNet-18 on a small synthetic set, 2 CPU processes (about 4 min).
DEMO_ARGS ?= --cpu --data synthetic --train-limit 1536 --test-limit 512 --epochs 3 --target-top1 90 \
             --batch-size 64 --no-progress --output $(DEMO)

# The README's comparison table: every strategy on the same CPU workload, then the report.
TABLE_ARGS ?= --cpu --data synthetic --train-limit 1536 --test-limit 512 --epochs 3 --target-top1 90 \
              --batch-size 64 --no-progress --output results
TABLE_STRATEGIES ?= dp ddp ddp-spawn ddp-launch ddp-amp fsdp horovod ddp-apex

.PHONY: install demo table test test-fast lint horovod clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	rm -rf $(DEMO)
	$(BIN)/bench list
	$(BIN)/bench run --strategy dp --gpus 2 $(DEMO_ARGS)
	$(BIN)/bench run --strategy ddp --gpus 2 $(DEMO_ARGS)
	$(BIN)/bench run --strategy ddp-spawn --gpus 2 $(DEMO_ARGS)
	$(BIN)/bench report --results $(DEMO)

# Horovod 0.28.1 built from source for the installed torch (C++ standard raised, Gloo, no MPI).
horovod: $(STAMP)
	$(BIN)/python scripts/build_horovod.py

table: $(STAMP)
	$(BIN)/bench run --strategy ddp --gpus 1 $(TABLE_ARGS)
	for s in $(TABLE_STRATEGIES); do \
	  $(BIN)/bench run --strategy $$s --gpus 2 $(TABLE_ARGS) || echo "$$s exited $$?"; \
	done
	$(BIN)/bench run --strategy ddp --gpus 2 --grad-accum 4 $(TABLE_ARGS)
	$(BIN)/bench report --results results --update-readme

lint: $(STAMP)
	$(BIN)/ruff check .

test: $(STAMP) lint horovod
	$(BIN)/python -m pytest

# The suite without building Horovod (its tests are then skipped with the reason).
test-fast: $(STAMP) lint
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache results/demo build .cache
