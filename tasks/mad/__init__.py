"""MAD's six synthetic tasks (Poli et al. 2024): task.py is the task (config and ``run``); data.py: the
generators; sources.py: which earlier tokens each answer can come from."""
