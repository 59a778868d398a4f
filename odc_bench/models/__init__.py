"""The model the ranks train (decoder.py) and the work it does (flops.py)."""
