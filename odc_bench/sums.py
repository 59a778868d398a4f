"""Float sums that come out as the same bits on every Python.

Python 3.12's sum() compensates the rounding of float additions (Neumaier's method); earlier
Pythons add left to right, one rounding per addition. Plans and simulated rows depend on the
bits: the vectorised balancers and cost sums (balancers/partition_many.py, quality.py's
microbatch_costs) add one column at a time, left to right, to equal the scalar code exactly, a
balancer's choice between two loads can turn on the last bit, and the committed simulated rows
are checked to it (tests/unit/test_sim_tables.py). So the float sums on the way from lengths
to a row are left_sum: the pre-3.12 arithmetic on every Python, which keeps every committed row.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable


def left_sum(values: Iterable[float]) -> float:
    """The values added left to right from 0.0, one rounding per addition (sum() before 3.12)."""
    return functools.reduce(operator.add, values, 0.0)
