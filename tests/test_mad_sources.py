"""tasks.mad.sources: each scored MAD target's answer offsets, checked against the data."""
import numpy as np
import pytest

from tasks.mad.data import IGNORE, generate, mad_settings
from tasks.mad.sources import answer_offsets, guess_accuracy


def _data(task, **changes):
    setting = {**mad_settings(task)[0], **changes, "num_test_examples": 40}
    x, y = generate(task, setting, "test", seed=4)
    return x.numpy(), y.numpy(), answer_offsets(task, x, y, setting["vocab_size"]), setting


@pytest.mark.parametrize("task", ["in-context-recall", "noisy-in-context-recall"])
def test_recall_answers_are_the_earlier_values_of_the_same_key(task):
    x, y, out, _ = _data(task)
    rows, t = np.nonzero(y != IGNORE)
    assert out.shape == (len(rows), x.shape[1]) and out.any(1).all()  # every scored key was shown before
    for i in range(len(rows)):  # one target at a time, by the definition
        r, at = rows[i], t[i]
        want = {at - (p + 1) for p in range(at - 1) if x[r, p] == x[r, at] and x[r, p + 1] == y[r, at]}
        assert set(np.nonzero(out[i])[0]) == want


def test_selective_copying_answers_are_the_data_tokens_in_order():
    x, y, out, setting = _data("selective-copying")
    rows, t = np.nonzero(y != IGNORE)
    assert (out.sum(1) == 1).all()
    src = t - out.argmax(1)
    assert (x[rows, src] == y[rows, t]).all() and (x[rows, src] < setting["vocab_size"] - 2).all()
    k = setting["num_tokens_to_copy"]
    assert (np.diff(src.reshape(-1, k), axis=1) > 0).all()  # the j-th output reads the j-th data token


def test_compression_reads_every_position_from_the_last_and_memorization_from_the_key():
    x, y, out, _ = _data("compression")
    L = x.shape[1]
    rows, t = np.nonzero(y != IGNORE)
    assert (out.sum(1) == 1).all() and (x[rows, L - 1 - out.argmax(1)] == y[rows, t]).all()
    x, y, out, _ = _data("memorization")
    assert out[:, 1].all() and out.sum() == len(out)
    assert answer_offsets("fuzzy-in-context-recall", *generate("fuzzy-in-context-recall", {
        **mad_settings("fuzzy-in-context-recall")[0], "num_test_examples": 4}, "test", 0), 16) is None


@pytest.mark.parametrize("task, changes", [("in-context-recall", {}), ("noisy-in-context-recall", {}),
                                           ("in-context-recall", {"multi_query": False, "vocab_size": 17}),
                                           ("selective-copying", {}), ("compression", {}),
                                           ("memorization", {"vocab_size": 32})])
def test_a_guess_picks_one_of_the_tokens_the_scored_answers_are_drawn_from(task, changes):
    # 40 test sequences draw every token of these small alphabets; the compression token (the
    # last target, always within reach) is no guess
    x, y, _, setting = _data(task, **changes)
    y = y[:, :-1] if task == "compression" else y
    drawn = np.unique(y[y != IGNORE])
    assert len(drawn) == round(1 / guess_accuracy(task, setting))
    assert guess_accuracy("fuzzy-in-context-recall", mad_settings("fuzzy-in-context-recall")[0]) is None
