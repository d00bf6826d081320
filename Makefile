# Two commands do the whole set-up: `make test` and `make demo` create .venv when it
# is missing. Override TORCH for your machine, e.g. TORCH="torch==2.5.1" on a GPU box.
PY      ?= python3
VENV    ?= .venv
TORCH   ?= torch==2.13.0
DATA    ?= ../shared/data
RESULTS ?= results
PARALLEL ?= 2
BIN     := $(VENV)/bin

.PHONY: venv test test-fast demo clean

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

# The smoke sweep on this machine: records, PNGs and a Markdown report under
# $(RESULTS)/smoke/. Data from $(DATA) when that folder exists, else the hub. A
# second `make demo` reruns only what has no 'ok' record.
demo: venv
	LINBENCH_DATA="$(abspath $(DATA))" $(BIN)/linbench run smoke --parallel $(PARALLEL) --results-dir $(RESULTS)
	$(BIN)/linbench plot smoke --results-dir $(RESULTS)
	$(BIN)/linbench report smoke --results-dir $(RESULTS)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
