"""Measurements rather than training runs: the timing harness (``timing``: isolated
child processes, memory caps, time limits), the scaling task (``scaling``: latency and
memory against sequence length), one LM training step per mixer (``trainstep``) and the
GPU check (``gpu_check``). A new benchmark is a module here on ``timing.run_point``."""
