"""The decode benchmark on a GPU: time per generated token after a context of 0 to
65,536 tokens, every zoo mixer alone at d_model 256 and 1,024, batch 1 and 64, bf16,
each mixer's fast path where its package is installed (tasks.benchmarks.decode).
An out-of-memory context is a row of the figure, and the mixer's longer contexts are
skipped.

    linbench run decode --executor slurm --partition gpu --gpus 1 --time 60
"""
import zoo
from sweeps import RunConfig
from tasks.benchmarks.decode import DecodeConfig

configs = [RunConfig("decode", DecodeConfig(mixer=mixer, d_model=d, batch=batch), label=mixer, exclusive=True)
           for d in (256, 1024) for batch in (1, 64) for mixer in zoo.MIXERS]
