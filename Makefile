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
# The CUDA kernels' packages. KERNELS=python (for a machine without CUDA): their Python
# parts only, pinned to the versions tests/kernel_standins.py knows, so that
# tests/test_fastpath_kernels.py runs every CUDA branch through the real code (fla's and
# mamba_ssm's Triton kernels under TRITON_INTERPRET=1, their Python references where the
# kernel is compiled CUDA). KERNELS=cuda: the cuda extra, built for the GPU. KERNELS=none.
KERNELS ?= python
PY_KERNELS := flash-linear-attention==0.6.0 einops
PY_KERNELS_NOCUDA := mamba-ssm==2.3.2.post1 causal-conv1d==1.7.0
NOCUDA_BUILD := MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE \
	CAUSAL_CONV1D_FORCE_BUILD=TRUE CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE

.PHONY: venv test test-fast demo gpu-check clean

venv: $(BIN)/.installed-$(KERNELS)

$(BIN)/.installed-$(KERNELS): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[dev]"
ifeq ($(KERNELS),python)
	$(BIN)/pip install -q $(PY_KERNELS)
	$(NOCUDA_BUILD) $(BIN)/pip install -q --no-deps --no-build-isolation $(PY_KERNELS_NOCUDA)
else ifeq ($(KERNELS),cuda)
	$(BIN)/pip install -q setuptools wheel packaging ninja
	$(BIN)/pip install -q --no-build-isolation -e ".[dev,cuda]"
endif
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

# On a CUDA machine: every cuda-marked test, each fast path against its torch path in
# bf16 (FlashAttention's rule) and the GPU benchmark, all under $(OUT)/, in about 8 min.
# With no network there, point PY at a Python that already has torch and the kernels:
#   make gpu-check VENV=/path/to/env KERNELS=none    (or: python -m tasks.gpu_check --out DIR)
gpu-check:
	$(MAKE) venv KERNELS=$(if $(filter python,$(KERNELS)),cuda,$(KERNELS))
	$(BIN)/python -m tasks.gpu_check --out "$(OUT)"

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
