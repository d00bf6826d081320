"""Public scan cores in one layout, flash-linear-attention's: q, k (B, L, H, K), v (B, L, H,
V), a state (B, H, K, V), for every linear-attention core (GLA, the delta rule, SSD,
RWKV-6, retention), so they can be checked against the references and swapped for the CUDA
kernels. Two stated exceptions keep their own references' layouts: the selective scan
takes mamba_ssm's (batch, channels, length), and the attention ops SDPA's (B, H, L, Dh). Each scan comes
in three forms with one signature: the op (the CUDA kernel when usable), its pure-PyTorch
chunked form, and ``*_ref``, the recurrence one step at a time (no ``chunk_size``, except
where it is positional: ``ssd_scan_ref`` takes and ignores it), which the tests prove the
others against and a user can check a kernel against too."""
from .conv import causal_conv1d, causal_conv1d_ref
from .delta_rule import gated_delta_rule, gated_delta_rule_chunked, gated_delta_rule_ref
from .fastpath import KERNELS, Kernel, optional, status, torch_only
from .gla import gla, gla_chunked, gla_ref
from .grassmann import grassmann_features_factored, grassmann_features_fused
from .rwkv6 import rwkv6_scan, rwkv6_scan_ref, rwkv6_scan_chunked
from .selective_scan import (selective_scan, selective_scan_chunked, selective_scan_fused_cpu,
                             selective_scan_ref)
from .ssd import ssd_scan, ssd_scan_chunked, ssd_scan_ref
