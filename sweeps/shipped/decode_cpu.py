"""The decode benchmark on a CPU: what one generated token costs after a context of
0 to 16,384 tokens, for every zoo mixer alone at d_model 256 and 1,024, batch 1 and 16,
float32, one thread. Each point prefills its context, then times 64 decode steps; the
read bandwidth of a matrix-vector product over 512 MiB, measured in the same run, sets the
limit each step is read against (tasks.benchmarks.decode).

Every mixer at its zoo defaults (the Grassmann mixer's offsets 1-16 and r = 32; a
16-token window): the comparison is of the architectures as shipped, at equal width,
not at equal parameters.

At d_model 256, batch 1 (where a fixed-state step and attention's take about the same time
at 1k of context) every other mixer is also timed against attention in the same process,
seven interleaved rounds a point (``baseline``): processes minutes apart on a shared
machine differ by more than these steps do.

    linbench run decode_cpu --parallel 1 --threads 1 --results-dir results/reference
    linbench plot decode_cpu --results-dir results/reference
"""
from sweeps import RunConfig
from tasks.benchmarks.decode import DecodeConfig

WIDTHS = (256, 1024)
BATCHES = (1, 16)
# named here, not read from the registry: its records are committed (see mad_cpu.py)
MIXERS = ("attention", "gated_deltanet", "gla", "grassmann", "mamba", "mamba2", "retnet", "rwkv6", "sliding_window")

SIDE_BY_SIDE = (256, 1)  # (d_model, batch) timed against attention round by round


def config(mixer: str, d: int, batch: int) -> DecodeConfig:
    paired = (d, batch) == SIDE_BY_SIDE and mixer != "attention"
    return DecodeConfig(mixer=mixer, d_model=d, batch=batch, device="cpu", baseline="attention" if paired else "")


configs = [RunConfig("decode", config(mixer, d, batch), label=mixer, exclusive=True)
           for d in WIDTHS for batch in BATCHES for mixer in MIXERS]
