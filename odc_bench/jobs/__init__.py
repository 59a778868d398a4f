"""The jobs a command runs: one training run from config to row (train.py), the communication
microbenchmark (primitives.py), and the progress display both feed (progress.py)."""
