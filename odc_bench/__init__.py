"""The benchmark harness: Hydra app, models, datasets, balancers, worker loop, launchers,
metrics and results I/O. See docs/architecture.md for the map."""
