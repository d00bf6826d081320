"""Multi-query associative recall (Zoology): task.py is the task (config and ``run``); data.py: the example generator."""
