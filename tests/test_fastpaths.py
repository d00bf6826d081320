"""The dispatch to CUDA fast paths: guards that check what a kernel really calls,
refused versions, one warning and a fallback instead of a crash, and the attention
decision made on the dtype the kernel sees. The calls themselves are checked against
the real packages in tests/test_fastpath_kernels.py."""
import sys
import types
import warnings

import pytest
import torch

import zoo
from zoo.mixers.attention import FLASH_ATTN, FLASH_KVCACHE
from zoo.ops.attention import LOCAL_BLOCK, attention_ref, local_attention
from zoo.ops import fastpath
from zoo.ops.fastpath import FLOAT, HALF, Kernel, torch_only


def flash_attn_documented(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                          window_size=(-1, -1), **others):
    """flash_attn_func as flash-attention's README documents it (it has no CPU form):
    q, k, v (batch, seqlen, nheads, headdim); softmax scale 1/sqrt(headdim) by default;
    query i attends to keys [i + Lk - Lq - window_size[0], i + Lk - Lq + window_size[1]]
    (-1: unbounded), and causal=True caps the right end at i + Lk - Lq. Computed in
    float64 from the definition, returned in q's dtype."""
    assert dropout_p == 0.0 and not others, others
    B, Lq, H, Dh = q.shape
    Lk = k.shape[1]
    scale = Dh ** -0.5 if softmax_scale is None else softmax_scale
    i = torch.arange(Lq)[:, None] + Lk - Lq
    j = torch.arange(Lk)[None, :]
    keep = torch.ones(Lq, Lk, dtype=torch.bool)
    left, right = window_size
    if causal:
        keep &= j <= i
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    scores = torch.einsum("bihd,bjhd->bhij", q.double(), k.double()) * scale
    p = scores.masked_fill(~keep, float("-inf")).softmax(-1)
    return torch.einsum("bhij,bjhd->bihd", p, v.double()).to(q.dtype)


def stand_in(monkeypatch, kernel, documented) -> list:
    """``kernel`` stood in by its documented semantics, allowed on CPU tensors; returns
    the keyword arguments of every call."""
    calls = []

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return documented(*args, **kwargs)

    monkeypatch.setattr(kernel, "fn", spy)
    monkeypatch.setattr(kernel, "devices", ("cuda", "cpu"))
    return calls


@pytest.fixture
def fake_flash(monkeypatch):
    """flash_attn_func stood in by its documented semantics, allowed on CPU tensors."""
    return stand_in(monkeypatch, FLASH_ATTN, flash_attn_documented)


# --- the attention decision ---------------------------------------------------------

def test_attention_decides_flash_on_a_cuda_bf16_setting(fake_flash):
    full, local = zoo.build_mixer("attention", 32), zoo.build_mixer("sliding_window", 32, window=4)
    assert full.choose_backend("cuda", torch.bfloat16) == "flash_attn"
    assert local.choose_backend("cuda", torch.float16) == "flash_attn"
    assert full.choose_backend("cuda", torch.float32) == "sdpa"  # flash has no fp32
    assert local.choose_backend("cuda", torch.float32) == "sdpa_local"  # never a dense L x L
    with torch_only():
        assert full.choose_backend("cuda", torch.bfloat16) == "sdpa"
        pinned = zoo.build_mixer("attention", 32, backend="flash_attn")
        assert pinned.choose_backend("cuda", torch.bfloat16) == "sdpa"  # torch_only wins
    assert zoo.build_mixer("attention", 512, n_heads=1).choose_backend("cpu", torch.bfloat16) \
        == "sdpa"  # head dim 512: flash-attn takes at most 256


def test_attention_without_flash_attn_installed_decides_sdpa(monkeypatch):
    monkeypatch.setattr(FLASH_ATTN, "fn", None)
    with pytest.warns(RuntimeWarning, match="flash_attn.flash_attn_func cannot run"):
        assert zoo.build_mixer("attention", 32).choose_backend("cuda", torch.bfloat16) == "sdpa"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once, not at every forward
        assert zoo.build_mixer("sliding_window", 32).choose_backend("cuda", torch.bfloat16) \
            == "sdpa_local"
    with pytest.raises(ValueError, match="backend='flash_attn' cannot run"):
        zoo.build_mixer("attention", 32, backend="flash_attn")


@pytest.mark.parametrize("mixer", ["attention", "sliding_window"])
def test_bf16_autocast_training_step_takes_flash_attn(fake_flash, mixer):
    """Under autocast the block hands the mixer fp32 (LayerNorm runs in fp32), but the
    projected q/k/v are bf16: that is what the kernel sees, so flash_attn runs."""
    cfg = zoo.ModelConfig(vocab_size=50, d_model=32, n_layers=2, max_len=40, mixer=mixer,
                          mixer_options={"n_heads": 2})
    model = zoo.build_model(cfg, seed=0)
    tokens = torch.randint(50, (2, 40))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1).float(),
                                                 tokens.flatten())
    loss.backward()
    assert model.backends() == {"0": "flash_attn", "1": "flash_attn"}
    window = (-1, -1) if mixer == "attention" else (16, 0)
    assert fake_flash and all(c["causal"] and c["window_size"] == window for c in fake_flash)


@pytest.mark.parametrize("mixer,options", [("attention", {"n_heads": 3}),
                                           ("sliding_window", {"n_heads": 3, "window": 5}),
                                           ("sliding_window", {"n_heads": 2, "window": 40})])
def test_flash_attn_call_matches_documented_semantics(fake_flash, monkeypatch, mixer, options):
    """The exact call of the CUDA branch, from the mixer's own weights, against the SDPA
    path: outputs and every gradient, odd shapes, weights moved off their init."""
    monkeypatch.setattr(FLASH_ATTN, "dtypes", FLOAT)  # compare in fp32, not bf16 noise
    fast = zoo.build_mixer(mixer, 48, **options)
    with torch.no_grad():
        for p in fast.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ref = zoo.build_mixer(mixer, 48, **options)
    ref.load_state_dict(fast.state_dict())
    x = torch.randn(2, 37, 48, requires_grad=True)
    dy = torch.randn(2, 37, 48)

    def run(m):
        y = m(x)
        return [y, *torch.autograd.grad(y, [x, *m.parameters()], dy)]

    got = run(fast)
    with torch_only():
        want = run(ref)
    assert fast.backend == "flash_attn" and ref.backend in ("sdpa", "sdpa_local")
    assert len(fake_flash) == 1
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def flash_attn_with_kvcache_documented(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None,
                                       softmax_scale=None, causal=False, window_size=(-1, -1), **others):
    """flash_attn_with_kvcache as flash-attention's docstring documents it: k_cache, v_cache
    (batch, seqlen_cache, nheads, headdim) are updated in place with k, v (batch, seqlen_new,
    nheads, headdim) starting at cache_seqlens (int32, (batch,)); then q attends to each
    sequence's first cache_seqlens + seqlen_new keys, causal aligned to the bottom right."""
    assert not others and k is not None and v is not None, others
    out = []
    for b, start in enumerate(cache_seqlens.tolist()):
        end = start + k.shape[1]
        k_cache[b, start:end], v_cache[b, start:end] = k[b], v[b]
        out.append(flash_attn_documented(q[b:b + 1], k_cache[b:b + 1, :end], v_cache[b:b + 1, :end],
                                         softmax_scale=softmax_scale, causal=causal, window_size=window_size))
    return torch.cat(out)


def test_attention_decode_through_flash_attn_with_kvcache(fake_flash, monkeypatch):
    """Full attention's prefill and steps on CUDA: flash_attn_with_kvcache on the cache
    (written in place through its transposed view), against the SDPA decode on the same
    weights; the window keeps its own path. Deleting the branch fails the count."""
    from test_decode import decode
    calls = stand_in(monkeypatch, FLASH_KVCACHE, flash_attn_with_kvcache_documented)
    for kernel in (FLASH_ATTN, FLASH_KVCACHE):
        monkeypatch.setattr(kernel, "dtypes", FLOAT)  # compare in fp32, not bf16 noise
    torch.manual_seed(0)
    m = zoo.build_mixer("attention", 48, n_heads=3, rotary=8).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
        x = torch.randn(2, 75, 48)  # past a 64-position block: the cache grows once mid-decode
        got, state = decode(m, x, prompt=60)
        assert m.backend == "flash_attn_kvcache"
        with torch_only():
            want, want_state = decode(m, x, prompt=60)
            assert m.backend == "sdpa"
    assert len(calls) == 1 + 15 and all(c["causal"] for c in calls)
    assert [c["cache_seqlens"].tolist() for c in calls[:2]] == [[0, 0], [60, 60]]
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(state["k"], want_state["k"])
    torch.testing.assert_close(state["v"], want_state["v"])
    window = zoo.build_mixer("sliding_window", 48, n_heads=3, window=5).eval()
    with torch.no_grad():
        decode(window, x[:, :10], prompt=4)
    assert len(calls) == 16 and window.backend == "sdpa"


@pytest.mark.parametrize("L,window", [(1, 16), (31, 16), (32, 16), (97, 16), (128, 3), (200, 40),
                                      (70, 69), (70, 100)])
def test_local_attention_is_the_reference(L, window):
    """sdpa_local against the readable dense reference, forward and every gradient, in
    float64: one block, whole blocks, a ragged last block, 3+ blocks, window >= L."""
    q, k, v = (torch.randn(2, 3, L, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    dy = torch.randn(2, 3, L, 8, dtype=torch.float64)
    got = local_attention(q, k, v, window)
    want = attention_ref(q, k, v, window)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    for a, b in zip(torch.autograd.grad(got, (q, k, v), dy), torch.autograd.grad(want, (q, k, v), dy)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_sliding_window_never_builds_an_L_by_L_mask(monkeypatch):
    """Every attention problem the torch path of sliding_window hands to SDPA has at most
    2 * max(window, LOCAL_BLOCK) keys, whatever L: its cost is linear in L."""
    import torch.nn.functional as F
    shapes, sdpa = [], F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        shapes.append((tuple(k.shape), None if attn_mask is None else tuple(attn_mask.shape)))
        return sdpa(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    m = zoo.build_mixer("sliding_window", 32, n_heads=2, window=16)
    m(torch.randn(1, 1000, 32))
    assert m.backend == "sdpa_local" and shapes
    keys = 2 * max(16, LOCAL_BLOCK)
    assert all(k[-2] <= keys and (mask is None or mask[-1] <= keys) for k, mask in shapes), shapes


# --- the guard: what the kernel calls, versions, one warning -------------------------

@pytest.fixture
def fake_package(monkeypatch):
    """A package 'fakepkg' whose module 'fakepkg.ops' defines a kernel that needs two
    helpers from another package; the test sets which of them exist."""
    monkeypatch.setattr(fastpath, "KERNELS", [])
    top = types.ModuleType("fakepkg")
    top.__version__ = "1.4.0"
    ops = types.ModuleType("fakepkg.ops")
    ops.kernel = lambda x: x + 1
    ops.conv_fwd = ops.conv_bwd = ops.conv_cuda = None
    monkeypatch.setitem(sys.modules, "fakepkg", top)
    monkeypatch.setitem(sys.modules, "fakepkg.ops", ops)
    return top, ops


def make_kernel(min_version="1.0"):
    return Kernel("fakepkg.ops", "kernel", "fakepkg", min_version, "its layout",
                  needs=(("conv_fwd", "conv_bwd"), ("conv_cuda",)))


def test_guard_checks_what_the_kernel_calls(fake_package):
    _, ops = fake_package
    k = make_kernel()
    assert k.fn is None and "kernel calls conv_fwd, conv_bwd" in k.why_not
    assert fastpath.status()[0]["importable"] is False
    ops.conv_fwd = ops.conv_bwd = len  # what newer versions import
    k.resolve()
    assert k.fn is ops.kernel and k.why_not is None
    ops.conv_fwd = ops.conv_bwd = None
    ops.conv_cuda = object()  # what older versions import instead
    k.resolve()
    assert k.fn is ops.kernel


def test_guard_refuses_a_version_too_old(fake_package):
    top, ops = fake_package
    ops.conv_cuda = object()
    k = make_kernel(min_version="2.0")
    assert k.fn is None
    assert k.why_not == "fakepkg 1.4.0 is older than 2.0 (its layout); refused"
    with pytest.warns(RuntimeWarning, match="fakepkg 1.4.0 is older than 2.0"):
        assert not k.allows("cuda", torch.bfloat16)
    top.__version__ = "2.0.1"
    k.resolve()
    assert k.fn is ops.kernel and k.allows("cuda", torch.bfloat16)


def test_guard_says_what_is_not_installed_and_warns_once_on_cuda_only(fake_package, monkeypatch):
    monkeypatch.delitem(sys.modules, "fakepkg.ops")
    monkeypatch.setitem(sys.modules, "fakepkg.ops", None)  # import raises ImportError
    k = make_kernel()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not k.allows("cpu", torch.float32)  # not a CUDA tensor: nothing to say
    with pytest.warns(RuntimeWarning, match="fakepkg 1.4.0 is installed but fakepkg.ops "
                                            "does not import"):
        assert not k.allows("cuda", torch.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not k.allows("cuda", torch.float16)
    assert not k.allows("cuda", torch.float64)  # dtype outside the kernel's: not asked


def test_version_tuple():
    assert fastpath.version_tuple("2.3.2.post1") == (2, 3, 2)
    assert fastpath.version_tuple("0.6.0rc1") == (0, 6, 0)
    assert fastpath.version_tuple("2.8.3+cu12torch2.5") == (2, 8, 3)
    assert fastpath.version_tuple("0.1.2") < fastpath.version_tuple("0.2.0")
    assert fastpath.version_tuple("2.3") == (2, 3, 0)


def test_every_kernel_is_in_the_cuda_extra_with_the_same_lower_bound():
    """pip refuses what the guard would refuse: the cuda extra's lower bounds are the
    kernels' minimum versions, and every kernel's package is in the extra."""
    import re
    import tomllib
    from pathlib import Path
    extra = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    bounds = dict(re.fullmatch(r"([\w-]+)>=([\d.]+)", req).groups()
                  for req in extra["project"]["optional-dependencies"]["cuda"] if ">=" in req)
    names = {k.name for k in fastpath.KERNELS}
    assert {"flash_attn.flash_attn_func", "fla.ops.rwkv6.chunk_rwkv6",
            "mamba_ssm.ops.selective_scan_interface.mamba_inner_fn",
            "mamba_ssm.ops.selective_scan_interface.selective_scan_fn",
            "mamba_ssm.ops.triton.ssd_combined.mamba_split_conv1d_scan_combined",
            "mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined"} <= names
    for k in fastpath.KERNELS:
        assert fastpath.version_tuple(bounds[k.package]) == fastpath.version_tuple(k.min_version), k
    assert HALF == FLASH_ATTN.dtypes


def test_fastest_picks_the_quickest_and_skips_failures():
    import time
    name, times = fastpath.fastest({"slow": lambda: time.sleep(0.02), "quick": lambda: None,
                                    "broken": lambda: 1 / 0}, torch.device("cpu"))
    assert name == "quick" and times["broken"] == float("inf") and times["slow"] >= 0.02
    with pytest.raises(ZeroDivisionError):
        fastpath.fastest({"broken": lambda: 1 / 0}, torch.device("cpu"))


def test_fastest_interleaves_its_rounds_and_keeps_each_best():
    import time
    calls, slow_spell = [], iter([0.03])  # the first timed call of "a" lands in a slow spell

    def a():
        calls.append("a")
        if len(calls) > 2:  # past both warm-ups
            time.sleep(next(slow_spell, 0.0))

    def b():
        calls.append("b")
        time.sleep(0.005)

    name, times = fastpath.fastest({"a": a, "b": b}, torch.device("cpu"), repeats=3)
    assert calls == ["a", "b"] + ["a", "b"] * 3  # warm-ups, then rounds of one call each
    assert name == "a" and times["a"] < 0.005 <= times["b"]
