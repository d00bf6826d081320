"""MAD (Poli et al. 2024) scaled to this project's 2-core CPU: every zoo mixer on each
task's baseline, and attention, grassmann, mamba2 and gated_deltanet on one of MAD's changes
per task (``VARIATIONS``), at MAD's model (width 128, two blocks, MAD's layer options).
``sweeps/shipped/mad.py`` is the whole protocol. As in MAD, the width is fixed and the sizes are not
matched: the report and docs/results.md give each mixer's parameters outside the embedding.

Sized by measurement (one thread, beside two running sweeps): a MAD step
(batch 128) takes 0.26-0.59 s at L 32, 1.2-2.3 s at L 128 and 2.6-7.1 s at L 256 across the
zoo, so MAD's 20,000 steps per run are days per run here. A pilot on in-context recall
(batch 32, lr 1e-3, 50 warm-up steps; its command was not written down) sat at 0.31-0.33
accuracy through 1,500 steps, then read 0.37 at 2,000, 0.44 at 2,500, 0.97 at 3,000 and 1.00
at 3,500, so the recall tasks got 3,000 steps of batch 32 (96,000 examples, 7.5 epochs;
MAD: 200 epochs of batch 128). The sweep's own attention (mad-lab's ``attention.yml``: one
head, rotary over all 128 channels, no learned positions) does not do that: its baseline
run reads 0.445, and the same config at 6,000 steps climbed without a jump, 0.31 at 500
steps, 0.42 at 3,000, 0.55 at 4,000, 0.62 at 6,000 (the last command below). What differs
is the model, not the schedule or the seed (results/reference/mad_cpu/pilots/, with the
commands): another seed reads 0.425, no decay after warm-up 0.377, mad-lab's 16-head
``mh-attention.yml`` 0.482, one head with learned positions 0.500, and four heads with
learned positions, the model ``python -m tasks mad`` built by default when the pilot ran,
0.759, leaving the plateau from step 900 on. So the pilot most likely trained the zoo's
default attention, not MAD's, over a cosine longer than 3,000 steps. That model under a cosine
over 6,000 steps (``pilots/heads4_6k.json``) reads 0.31, 0.41, 0.65, 0.94 and 0.995 at its
evaluations of steps 600 to 3,000, and stops there at the 0.99 target. So the recall
recipe is that: attention and the window are the zoo's attention (``OPTIONS``: 4 heads,
learned positions, as in every other task here; a documented departure from mad-lab's
``attention.yml``, made so that the recall columns have a control that solves them), and
the recall tasks get a cosine over 6,000 steps, each run stopping at 0.99. Under it attention
solves fuzzy recall too (0.993 at step 3,600) but not noisy recall (0.744 after all 6,000
steps; MAD's Transformer averages 0.868 over its noisy settings): that column is read against
attention's level, not a solved task. Selective copying and compression get 1,000 steps, and
memorization MAD's own 200 epochs of its 256 examples (1,600 steps of L 32).
Selective copying is not converged at 1,000 steps: attention's pilot read 0.42, 0.52, 0.61,
0.65, 0.69 at steps 200-1,000 (MAD's Transformer: 1.00), so that column ranks how fast
each mixer learns to copy, not how well it finally does (each further 1,000 steps would
cost about 4 core-hours over its 13 runs at L 256).
One learning rate, the pilot's 1e-3 (MAD's largest), with its 50 warm-up steps, and
weight decay 0: every further lr or decay would double a budget already of about 21
core-hours at the step times measured under load (7-11 hours on both cores, past the
4 hours planned: fewer steps would leave the recall tasks at the plateau for attention itself,
so they would measure nothing), so MAD's best-of-six is a best-of-one here,
and a mixer whose best lr lies elsewhere is under-rated. A run stops once its test
accuracy (MAD's, ``tasks.mad.task.mad_metrics``) reaches 0.99 (evaluated ten times a run), as
mqar_cpu's do: the 21 core-hours are the bound for mixers that solve nothing, and a solved
task reports its evaluation of lowest perplexity, about 0.99, where MAD, training on, may
report 1.00. The scores are read at a budget
some 27x smaller than MAD's on recall: which capabilities each mixer acquires in it, not
MAD's converged numbers. Compression and selective copying, which no mixer saturates here,
also run seeds 1 and 2 at their baselines (``SEEDED_TASKS``): their scores are the mean over
3 seeds, so an order between two mixers does not rest on one run (about 1.5 and 10 minutes
a run).

    linbench run mad_cpu --parallel 2 --results-dir results/reference
    linbench plot mad_cpu --results-dir results/reference && linbench report mad_cpu --results-dir results/reference
    python -m tasks mad --set model.mixer=attention --set 'model.mixer_options={"n_heads": 1, "rotary": 128}' \
        --set model.positions=none --set train.steps=6000 --set train.batch_size=32 --set train.lr=1e-3 \
        --set train.min_lr_ratio=1e-3 --set train.warmup_steps=50 --set train.eval_every=500 --set train.target=0.99
"""
from sweeps import RunConfig
from tasks.mad.task import sweep_configs
from tasks.mad.data import BASELINES

LRS = (1e-3,)
WEIGHT_DECAYS = (0.0,)
STEPS = {"in-context-recall": 6000, "fuzzy-in-context-recall": 6000, "noisy-in-context-recall": 6000,
         "selective-copying": 1000, "compression": 1000, "memorization": None}  # None: MAD's 200 epochs
# The control: the zoo's attention (4 heads, learned positions), which solves in-context
# recall in this budget where mad-lab's one-head rotary attention does not; the window is
# the same attention kept to MAD's 32 tokens.
ATTENTION = {"n_heads": 4, "rotary": 0}
OPTIONS = {"attention": ATTENTION, "sliding_window": {**ATTENTION, "window": 32}}
VARIED = ("attention", "grassmann", "mamba2", "gated_deltanet")
# One change per task, of the kinds MAD varies: length, vocabulary, noise, vocabulary, data size
# (1,600 examples: many more epochs in the same steps), keys. Selective copying changes its
# vocabulary, not its tokens to copy: mad-lab ignored num_tokens_to_copy until December 2024,
# so the published scores' "copy 32" most likely copied 16 (tasks/mad/data.py's docstring).
VARIATIONS = [("in-context-recall", {"seq_len": 256}), ("fuzzy-in-context-recall", {"vocab_size": 32}),
              ("noisy-in-context-recall", {"frac_noise": 0.4}), ("selective-copying", {"vocab_size": 32}),
              ("compression", {"num_train_examples": 1600}), ("memorization", {"vocab_size": 1024})]


# Seeds where the order among mixers turns on one run: 2 more at the baselines of the tasks
# that no mixer saturates and that have no control of their own (memorization is solved by
# every mixer here; the recall columns are read against attention's).
SEEDED_TASKS = ("compression", "selective-copying")
EXTRA_SEEDS = (1, 2)


# The mixers this experiment compares, named here: its records are committed, so a mixer
# registered later joins exploratory sweeps (smoke, scaling, decode, vet), not this one.
MIXERS = ("attention", "gated_deltanet", "gla", "grassmann", "mamba", "mamba2", "retnet", "rwkv6", "sliding_window")


def configs_for(mixer: str, settings: list, seed: int = 0, options: dict | None = None) -> list:
    """This recipe's runs of ``mixer`` (``options``: its own, else OPTIONS' for a zoo mixer)."""
    return [cfg for task, changes in settings
            for cfg in sweep_configs(mixer, [(task, changes)], options=OPTIONS.get(mixer) if options is None else options,
                                     lrs=LRS, weight_decays=WEIGHT_DECAYS, batch_size=32, max_steps=STEPS[task], evals=10,
                                     warmup_steps=50, target=0.99, seed=seed)]


configs = [RunConfig("mad", cfg, label=mixer)
           for mixer in MIXERS
           for cfg in configs_for(mixer, [(task, {}) for task in BASELINES]
                                  + (VARIATIONS if mixer in VARIED else []))]
configs += [RunConfig("mad", cfg, label=mixer) for seed in EXTRA_SEEDS for mixer in MIXERS
            for cfg in configs_for(mixer, [(task, {}) for task in SEEDED_TASKS], seed=seed)]
