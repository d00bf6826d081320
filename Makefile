# Two commands do the whole set-up: `make test` and `make demo` create .venv when it
# is missing. Override TORCH for your machine, e.g. TORCH="torch==2.5.1" on a GPU box.
PY      ?= python3
VENV    ?= .venv
TORCH   ?= torch==2.13.0
DATA    ?= ../shared/data
BIN     := $(VENV)/bin

.PHONY: venv test test-fast clean

venv: $(BIN)/.installed

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

test: venv
	$(BIN)/python -m pytest -q

test-fast: venv
	$(BIN)/python -m pytest -q -m "not slow"

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
