"""Long-context scaling of every zoo mixer: forward and forward+backward latency,
tokens/s and peak memory for L = 256, 512, ... at 16,384 tokens per batch (so a
linear-time mixer shows a flat time), d_model 256, one mixer alone, 3 seeds. Up to
L = 16,384 on a GPU (bf16; each mixer's fast path where its package is installed),
4,096 on a CPU. Out-of-memory and time-outs are points of the curve, marked in the
figures, and the longer lengths of that mixer are skipped.

    linbench run scaling --executor slurm --partition gpu --gpus 1 --time 120
"""
import zoo
from sweeps import RunConfig
from tasks.benchmarks.scaling import ScalingConfig

SEEDS = (0, 1, 2)
OPTIONS = {"sliding_window": {"window": 256}, "grassmann": {"impl": "auto"}}  # the rest at zoo defaults

configs = [RunConfig("scaling", ScalingConfig(mixer=mixer, mixer_options=OPTIONS.get(mixer, {}), seed=seed),
                     label=mixer, exclusive=True) for mixer in zoo.MIXERS for seed in SEEDS]
