"""MAD (Poli et al. 2024) scaled to this project's 2-core CPU: every zoo mixer on each
task's baseline, and attention, grassmann, mamba2 and gated_deltanet on one change of
each task's own dimension, at MAD's model (width 128, two blocks, MAD's layer options)
and MAD's two largest learning rates. ``sweeps/mad.py`` is the whole protocol.

What a CPU affords, measured first (one thread, step times of MAD's model beside two
running sweeps, and pilot runs; issue 17's notes): a MAD step (batch 128) takes 0.26-0.59 s
at L 32, 1.2-2.3 s at L 128 and 2.6-7.1 s at L 256 across the zoo, so MAD's 20,000 steps
per run are days per run here. So: batch 32 and 500 steps (16,000 examples, 1.25 epochs of
the 12,800; MAD: 200 epochs of batch 128), evaluated 5 times; memorization keeps MAD's 200
epochs of its 256 examples (1,600 steps of L 32, cheap). Learning rates 5e-4 and 1e-3
(MAD's 1e-4 barely moves a model in 500 steps); weight decay 0 only: at lr 1e-3, MAD's 0.1
shrinks weights by at most (1 - 1e-4)^500 = 0.95 over the run, so its second run would
repeat the first. The scores are therefore read at a budget some 160x smaller than MAD's:
a ranking of how fast each mixer acquires each capability, not MAD's converged numbers.

    linbench run mad_cpu --parallel 2 --results-dir results/reference
    linbench plot mad_cpu --results-dir results/reference && linbench report mad_cpu --results-dir results/reference
"""
import zoo
from sweeps import RunConfig
from tasks.mad import sweep_configs
from tasks.mad_data import BASELINES

LRS = (5e-4, 1e-3)
WEIGHT_DECAYS = (0.0,)
BUDGET = dict(batch_size=32, max_steps=500, evals=5)
UNCAPPED = {"memorization"}  # MAD's own 200 epochs fit: 1,600 steps of L 32
VARIED = ("attention", "grassmann", "mamba2", "gated_deltanet")
# One change per task, along the dimension that task varies most in MAD: length, vocabulary,
# noise, tokens to copy, data size (1,600 examples: 10 epochs in the same steps) and keys.
VARIATIONS = [("in-context-recall", {"seq_len": 256}), ("fuzzy-in-context-recall", {"vocab_size": 32}),
              ("noisy-in-context-recall", {"frac_noise": 0.4}), ("selective-copying", {"num_tokens_to_copy": 32}),
              ("compression", {"num_train_examples": 1600}), ("memorization", {"vocab_size": 1024})]


def configs_for(mixer: str, settings: list) -> list:
    out = []
    for task, changes in settings:
        budget = dict(BUDGET, max_steps=None) if task in UNCAPPED else BUDGET
        out += sweep_configs(mixer, [(task, changes)], lrs=LRS, weight_decays=WEIGHT_DECAYS, **budget)
    return out


configs = [RunConfig("mad", cfg, label=mixer)
           for mixer in sorted(zoo.MIXERS)
           for cfg in configs_for(mixer, [(task, {}) for task in BASELINES]
                                  + (VARIATIONS if mixer in VARIED else []))]
