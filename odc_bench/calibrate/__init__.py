"""The calibrations, one module each, named for what they fit:

- cost_model.py: this machine's compute of the run's model, whole microbatches (the balancers'
  `calibrated` cost model) and, on CUDA, every unit (a GPU profile's measured compute);
- cpu_profile.py: the simulator's profile of this machine's CPU ranks, from real runs' traces;
- cluster_profile.py: a GPU profile fitted to collective runs measured on the user's cluster.

Each is a command: `python -m odc_bench.calibrate.NAME`.
"""
