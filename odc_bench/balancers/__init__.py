"""The plan stage's balancers: pure functions from a minibatch's sample lengths to a per-rank
microbatch plan (one record each in registry.py), the cost models they plan with (cost.py),
and how good a plan is predicted to be (quality.py)."""
