"""linbench's model zoo: mixers, scan cores, the LM backbone and parameter matching."""
from .causality import CausalityError, assert_causal, check_causal, check_mixer_causal
from .config import StrictConfig
from .mixers import MIXERS, Mixer, build_mixer, chunk_sizes, mixer_class, pin_chunk_sizes
from .generate import generate
from .stepping import STEP_IMPLS, fast_steps
from .model import LM, ModelConfig, build_model
from .params import Match, config_params, count_params, match_params
