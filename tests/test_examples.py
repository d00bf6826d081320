"""The mixers of examples/ (outside zoo/, named by import path): the shared harness and
the step-form checks run on them as on a shipped mixer, and each fast form is held to its
step-by-step reference."""
from __future__ import annotations

import pytest
import torch

import zoo
from examples.mingru import scan, scan_ref
from test_toy_mixer import harness_cases, run_check
from zoo.checks import mixer_checks

MINGRU = "examples.mingru:MinGRU"


@pytest.mark.parametrize("check, kwargs", list(harness_cases(MINGRU)))
def test_shared_harness(check, kwargs, request):
    run_check(check, kwargs, request)


@pytest.mark.parametrize("options", [{}, {"expand": 2}])
def test_every_vet_check_passes(options):
    failed = [c for c in mixer_checks(MINGRU, options) if c.passed is False]
    assert not failed, failed


@pytest.mark.parametrize("L, chunk", [(1, 256), (37, 256), (37, 7), (64, 16)])
def test_scan_matches_its_reference(L, chunk):
    """Outputs and every gradient, float64, chunk boundaries inside the sequence, from a
    nonzero state."""
    k, u = (torch.randn(2, L, 5, dtype=torch.float64, requires_grad=True) for _ in range(2))
    h0 = torch.rand(2, 5, dtype=torch.float64, requires_grad=True)
    fast, ref = scan(k, u, h0, chunk=chunk), scan_ref(k, u, h0)
    torch.testing.assert_close(fast, ref, rtol=1e-10, atol=1e-12)
    weights = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad((fast * weights).sum(), (k, u, h0)),
                    torch.autograd.grad((ref * weights).sum(), (k, u, h0))):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_scan_stays_accurate_in_float32_over_long_sequences():
    """Chunking keeps the log-space sums resolvable: over 8,192 tokens of strong gates the
    float32 scan stays within 1e-3 of the float64 reference (one unchunked sum drifts)."""
    k, u = torch.randn(1, 8192, 4) * 3, torch.randn(1, 8192, 4) * 3
    ref = scan_ref(k.double(), u.double(), torch.zeros(1, 4, dtype=torch.float64))
    assert (scan(k, u, torch.zeros(1, 4)).double() - ref).abs().max() < 1e-3
    assert (scan(k, u, torch.zeros(1, 4), chunk=8192).double() - ref).abs().max() > 1e-3


def test_it_is_outside_the_zoo():
    assert MINGRU not in zoo.MIXERS and "mingru" not in zoo.MIXERS
    assert zoo.mixer_class(MINGRU).option_names == ("expand",)
