import os

import torch

# Without CUDA the Triton kernels run through Triton's interpreter. Triton reads the
# variable when it is first imported (importing zoo imports it), so it must be set
# here, before any test module imports zoo.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

# Small, deterministic, and kind to a 2-core CI machine.
torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _restore_kernels():
    """Tests route fast paths (a stand-in kernel, CPU allowed, a guard re-resolved against
    patched modules): every kernel is put back as it was after each test."""
    from zoo.ops.fastpath import KERNELS
    saved = [(k, dict(vars(k))) for k in KERNELS]
    yield
    for kernel, state in saved:
        vars(kernel).clear()
        vars(kernel).update(state)
