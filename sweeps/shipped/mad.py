"""MAD's whole protocol (Poli et al. 2024, athms/mad-lab): every zoo mixer at MAD's width
128 and two blocks on every setting of the six tasks (``tasks.mad.data.mad_settings``: the
baseline, then each change of vocabulary, length, data size or noise alone; 66 settings),
each at MAD's 3 learning rates x 2 weight decays for 200 epochs of batch 128
(``tasks.mad.task.sweep_configs``). The MAD score keeps the best of the six per setting, averages
a task's settings, then the tasks (``results.stats.mad_scores``). 3,564
runs of up to 20,000 steps: a cluster job (on this project's 2-core CPU, ``mad_cpu``).

    linbench run mad --executor slurm --partition gpu --gpus 1 --time 120
    linbench report mad && linbench plot mad
"""
import zoo
from sweeps import RunConfig
from tasks.mad.task import sweep_configs
from tasks.mad.data import BASELINES, mad_settings

SETTINGS = [(task, setting) for task in BASELINES for setting in mad_settings(task)]


def configs_for(mixer: str, settings: list, seed: int = 0, options: dict | None = None) -> list:
    """MAD's protocol on ``settings`` for ``mixer`` (``linbench vet --budget gpu`` builds
    its mixer's with it)."""
    return sweep_configs(mixer, settings, options=options, seed=seed)


configs = [RunConfig("mad", cfg, label=mixer)
           for mixer in sorted(zoo.MIXERS) for cfg in configs_for(mixer, SETTINGS)]
