"""The learnable token source's chain as numbers: its branch probabilities and its entropy rate.

Apart from data/learnable.py (which draws the ids, with torch) so that figures and tables can
draw the loss floor without importing torch.
"""

from __future__ import annotations

import math

# Probabilities of a token's 1st, 2nd, ... successor: skewed, so the floor is far below
# log(vocab) and the most likely successor alone is right most of the time.
BRANCH_PROBS: tuple[float, ...] = (0.6, 0.25, 0.1, 0.05)


def entropy_rate(probs: tuple[float, ...] = BRANCH_PROBS) -> float:
    """Nats per labelled token that a perfect model still pays: the entropy of one row."""
    return -sum(p * math.log(p) for p in probs if p > 0)
