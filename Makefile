# Two commands for a newcomer: `make demo` (the main job) and `make test`.
# Each creates and uses its own virtual environment in .venv.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# A pinned torch is installed before the project: on a machine with a local CPU
# wheel (find-links) pip takes it, elsewhere PyPI's default build (CUDA on Linux).
# Override for another build, e.g. TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126".
TORCH_SPEC ?= torch==2.13.0
# Installs under the versions the tests last passed with; empty (make venv CONSTRAINTS=) takes
# the newest releases, to update constraints.txt from.
CONSTRAINTS ?= -c constraints.txt
# Where `make demo` serves (another port when 8000 is taken: make demo PORT=8001).
PORT ?= 8000

.PHONY: venv demo test lint bench clean

$(BIN)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q $(TORCH_SPEC)
	$(BIN)/pip install -q $(CONSTRAINTS) -e ".[dev]"
	touch $@

venv: $(BIN)/.installed

demo: venv
	$(BIN)/python -m service.demo --port $(PORT)

test: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest

bench: venv
	$(BIN)/python -m benchmarks.ltsf --data ../shared/data/ETTh1.csv --json benchmarks/results/etth1_make_bench.json

clean:
	rm -rf $(VENV) mlruns mlartifacts mlflow.db data/service
