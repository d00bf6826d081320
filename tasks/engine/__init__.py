"""What every task shares: the training loop (``train``), losses (``losses``), the data
cache and text loaders (``data``), the fields every record carries (``runs``), progress
heartbeats (``progress``) and the command-line plumbing (``cli``)."""
