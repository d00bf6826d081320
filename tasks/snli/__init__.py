"""SNLI with a frozen or fine-tuned LM encoder (the paper's second task): task.py is the task (config and
``run``); heads.py: the classifier heads; features.py: the offline pretrained encoder and its cached features."""
