"""The model the ranks train (qwen2.py) and the work it does (flops.py)."""
