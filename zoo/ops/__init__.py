"""Public scan cores, with the argument layouts of the established references
(mamba_ssm's selective_scan_ref, flash-linear-attention's naive_recurrent_rwkv6)
so they can be checked against them and swapped for the CUDA kernels."""
from .delta_rule import gated_delta_rule, gated_delta_rule_chunked, gated_delta_rule_ref
from .fastpath import KERNELS, Kernel, optional, status, torch_only
from .gla import gla, gla_chunked, gla_ref
from .grassmann import grassmann_features_factored, grassmann_features_fused
from .rwkv6 import rwkv6_scan
from .selective_scan import selective_scan
from .ssd import ssd_scan
