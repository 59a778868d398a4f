"""Put on PYTHONPATH, every Python process of a run (a SLURM task included) fails to build torch's
AdamW, as AdamW fails on a learning rate below 0: a run that passed every check before it started
and fails on every rank (tests/integration/test_slurm.py). A negative optim.lr did this until the
config refused it itself, before any rank starts."""

import torch.optim


class _Refused(torch.optim.AdamW):
    def __init__(self, *args: object, **kwargs: object) -> None:
        raise ValueError("Invalid learning rate: AdamW refused by tests/helpers/failing_optimizer")


torch.optim.AdamW = _Refused  # type: ignore[misc]
