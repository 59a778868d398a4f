"""The config stage: the command line composed by Hydra (compose.py), turned into one frozen,
checked RunConfig (run.py) whose sections (model.py, dataset.py, engine.py, balancer.py,
backend.py) every later stage reads as typed attributes."""
