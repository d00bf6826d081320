"""Does bf16 autocast change a CPU result? wikitext2_cpu's runs again under bf16 autocast.

The same configs as ``wikitext2_cpu`` (every mixer and the two hybrids, parameter-matched,
800k training tokens, seeds 0-2) with ``train.precision = "bf16"``: the fp32 records of
that sweep are the other half of the comparison, and their three seeds give the spread a
precision change must stay within before a local sweep may use bf16. Seed 0 first
(``--only seed=0``), then the whole sweep for every seed; docs/results.md sets each model's
change beside that spread. At this width bf16 autocast buys little time even on a CPU
with AMX (0.92x to 1.37x a training step, per mixer, in docs/performance.md): the question
here is only whether it moves a result.

    linbench run wikitext2_bf16_cpu --only seed=0 --parallel 2 --threads 1
    linbench headline --write docs/results.md
"""
from sweeps import RunConfig
from sweeps.spec import load_sweep

# the fp32 sweep's file read afresh, as `linbench` reads it (a cached import of its module
# would keep whatever the process had changed since it was first imported)
# (its first 33, at 1e-3: the learning-rate bracket that follows them is not rerun here)
configs = [RunConfig(run.task, run.config.replace(train=run.config.train.replace(precision="bf16")), run.label)
           for run in load_sweep("wikitext2_cpu").runs if run.config.train.lr == 1e-3]
