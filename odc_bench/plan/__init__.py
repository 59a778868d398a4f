"""The plan stage: a typed config, its dataset's lengths and its balancer become a RunSpec,
every minibatch planned before any rank starts (spec.py)."""
