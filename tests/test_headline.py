"""results.headline: the README's tables, on small synthetic records."""
import pandas as pd

from results.headline import lm_table, mad_table, mqar_table, published_gaps
from results.stats import gap_interval


def _mqar(label, L, d, lr, acc, state):
    return {"task": "mqar", "run_status": "ok", "label": label, "seq_len": L, "num_kv_pairs": L // 16,
            "d_model": d, "lr": lr, "accuracy": acc, "state_size": state, "seed": 0}


def test_mqar_table_keeps_the_best_lr_and_ranks_by_the_longest_length():
    rows = [_mqar("a", 64, 32, lr, acc, 100) for lr, acc in ((1e-3, 0.2), (1e-2, 0.9))]
    rows += [_mqar("a", 128, 32, 1e-3, 0.1, 200), _mqar("b", 64, 32, 1e-3, 0.5, 7), _mqar("b", 128, 32, 1e-3, 0.6, 7)]
    rows.append({**_mqar("b", 128, 32, 1e-2, 1.0, 7), "run_status": "failed"})  # not a result
    lines = mqar_table(pd.DataFrame(rows)).splitlines()
    assert lines[0] == "| mixer | L = 64, 4 pairs | L = 128, 8 pairs | state floats at L = 128 |"
    assert lines[2:] == ["| b | 0.500* | 0.600* | 7 |", "| a | 0.900 | 0.100* | 200 |"]  # *: 1 of 2 lrs


def test_lm_table_gives_the_gap_with_its_interval():
    def run(label, mixer, seed, val):
        return {"task": "wikitext2", "run_status": "ok", "label": label, "mixer": mixer, "seed": seed,
                "best_val_ppl": val, "test_ppl": val + 1, "params_no_embeddings": 4.7e6,
                "train_flops_per_token": 42.27e6, "epochs_seen": 2.0}
    frame = pd.DataFrame([run("attention", "attention", 0, 200.0), run("attention", "attention", 1, 204.0),
                          run("grassmann", "grassmann", 0, 230.0), run("grassmann", "grassmann", 1, 226.0)])
    gap, low, high = gap_interval([230.0, 226.0], [200.0, 204.0])
    lines = lm_table(frame).splitlines()
    assert lines[2].startswith("| attention | 4.70M | 42.3M | 2.00 | 2 | 202.0 ± 2.8 | 203.0 ± 2.8 | 0 |")
    want = f"+{100 * gap:.1f} % [+{100 * low:.1f} %, +{100 * high:.1f} %]"
    assert lines[3] == f"| grassmann | 4.70M | 42.3M | 2.00 | 2 | 228.0 ± 2.8 | 229.0 ± 2.8 | {want} |"


def test_published_gaps_pair_each_sources_first_values():
    pub = pd.DataFrame([
        {"task": "wikitext2", "source": "s", "setting": "6L/128", "mixer": m, "split": "validation", "value": v}
        for m, v in (("attention", 200.0), ("attention", 210.0), ("grassmann", 250.0))])
    assert published_gaps(pub).splitlines()[2] == "| s | 6L/128 | 200 | 250 | +25.0 % |"


def test_mad_table_puts_ours_beside_the_published_scores():
    def run(label, task, setting, lr, acc):
        return {"task": "mad", "run_status": "ok", "label": label, "mad_task": task, "setting": setting,
                "lr": lr, "weight_decay": 0.0, "accuracy": acc, "seed": 0}
    frame = pd.DataFrame([run("a", "compression", "s1", 1e-3, 0.2), run("a", "compression", "s1", 5e-4, 0.4),
                          run("a", "memorization", "s2", 1e-3, 1.0), run("b", "compression", "s1", 1e-3, 0.9),
                          {**run("b", "memorization", "s2", 1e-3, 1.0), "run_status": "failed"}])
    pub = pd.DataFrame([{"task": "mad", "model": "T", "setting": t, "value": v}
                        for t, v in (("compression", 0.5), ("memorization", 0.8), ("average", 0.65))])
    lines = mad_table(frame, pub).splitlines()
    assert lines[0] == "| model | settings | task mean | compression | memorization |"
    assert lines[2:] == ["| b (ours) | 1 | 0.900 | 0.900 | – |",  # its failed run is not a score
                         "| a (ours) | 2 | 0.700 | 0.400 | 1.000 |",  # best lr per setting, then the mean
                         "| T (MAD) | all | 0.650 | 0.500 | 0.800 |"]
