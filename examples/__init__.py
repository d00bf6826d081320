"""Mixers that live outside ``zoo/``, named by import path (``examples.mingru:MinGRU``):
what a researcher's own package looks like to linbench, and the mixers of the committed
``linbench vet`` cards."""
