"""The results table's schema (results/README.md defines each column): in a module of its own,
which imports nothing, so that every reader of a table (the figures too) reads it the same way."""

SCHEMA_VERSION = 7

# The tidy columns every row has, in order (results/README.md defines each).
COLUMNS = [
    "run_id", "schema_version", "attempt", "status", "error", "timestamp", "commit", "host",
    "backend", "engine", "balancer", "variant", "shard", "fetch", "staleness", "cost_model", "model", "dataset",
    "world_size", "minibatch_size", "num_minibatches", "warmup_minibatches", "max_tokens", "packing_ratio",
    "length_scale", "precision", "attention", "seed", "samples", "len_mean", "len_p50", "len_p99", "len_max",
    "samples_per_s", "tokens_per_s", "mfu", "bubble_rate", "predicted_bubble_rate",
    "compute_s", "sync_s", "peak_mem_mb", "heap_mb", "mem_estimate_mb", "mem_limit_mb", "wall_s",
    "loss_first", "loss_last", "resumed_from", "requeues", "trace", "config",
]

# The columns that hold text. A CSV does not say which they are, and pandas takes text that looks
# like a number for one: a model folder named 0007 came back as 7, and with it every table the
# next row rewrote (append_row), and a table holding both 7 and "tiny" could not be collected.
TEXT_COLUMNS = ("run_id", "status", "error", "timestamp", "commit", "host", "backend", "engine", "balancer",
                "variant", "shard", "fetch", "cost_model", "model", "dataset", "precision", "attention", "trace",
                "config")
