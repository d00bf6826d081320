"""Does bf16 autocast change a CPU result? wikitext2_cpu's runs again under bf16 autocast.

The same configs as ``wikitext2_cpu`` (every mixer and the two hybrids, parameter-matched,
800k training tokens, seeds 0-2) with ``train.precision = "bf16"``: the fp32 records of
that sweep are the other half of the comparison, and their three seeds give the spread a
precision change must stay within before a local sweep may use bf16. Seed 0 first
(``--only`` a label, or the whole sweep for every seed). On a CPU with AMX a bf16 step is
1.3 to 2.5 times faster than fp32 (docs/performance.md measures it per mixer).

    linbench run wikitext2_bf16_cpu --parallel 2 --threads 1 && linbench report wikitext2_bf16_cpu
"""
from sweeps import RunConfig
from sweeps.shipped.wikitext2_cpu import configs as fp32_configs

configs = [RunConfig(run.task, run.config.replace(train=run.config.train.replace(precision="bf16")), run.label)
           for run in fp32_configs]
