"""Tasks: each is a typed config (rejecting unknown keys) plus ``run(cfg, workdir,
progress) -> dict``, a flat record of metrics and metadata. ``TASKS`` maps a task
name to ``(ConfigClass, run)``; the sweep launcher only ever goes through it."""
from .train import TrainConfig, TrainResult, train

TASKS: dict = {}
from . import snli as _snli, wikitext2 as _wikitext2  # noqa: E402
TASKS["wikitext2"] = (_wikitext2.WikiText2Config, _wikitext2.run)
TASKS["snli"] = (_snli.SNLIConfig, _snli.run)
from . import mqar as _mqar, scaling as _scaling  # noqa: E402
TASKS["mqar"] = (_mqar.MQARConfig, _mqar.run)
TASKS["scaling"] = (_scaling.ScalingConfig, _scaling.run)
