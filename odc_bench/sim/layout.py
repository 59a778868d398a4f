"""Where a microbatch's time goes, position by position: the units in execution order.

A microbatch runs 2U positions for U units (embed, layer0..layerN-1, head): forward over
every unit, then backward from the head down to the embeddings. The embeddings' backward
is not a traced span in real runs (its input carries no gradient, see models/decoder.py), so
the simulator computes it but, like a real run, records no event for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from odc_bench.config.model import UNIT_KINDS, ModelConfig
from odc_bench.models.memory import unit_params

KINDS = UNIT_KINDS
PHASES = ("fwd", "bwd")


@dataclass(frozen=True)
class Layout:
    cfg: ModelConfig

    @property
    def units(self) -> int:
        return len(self.cfg.units)

    @property
    def positions(self) -> int:
        return 2 * self.units

    @cached_property
    def unit_names(self) -> list[str]:
        return [name for name, _ in self.cfg.units]

    @cached_property
    def unit_kind(self) -> np.ndarray:
        """Index into KINDS of every unit."""
        return np.array([KINDS.index(kind) for _, kind in self.cfg.units])

    @cached_property
    def unit_params(self) -> np.ndarray:
        """Parameters of every unit: what FSDP shards, gathers and reduces per unit."""
        return np.array(unit_params(self.cfg), dtype=np.float64)

    @cached_property
    def position_unit(self) -> np.ndarray:
        u = np.arange(self.units)
        return np.concatenate([u, u[::-1]])

    @cached_property
    def position_phase(self) -> np.ndarray:
        """0 forward, 1 backward."""
        return np.repeat([0, 1], self.units)

    @cached_property
    def position_cost_index(self) -> np.ndarray:
        """Column of a (kind, phase) cost table (KINDS x PHASES, row-major) for every position."""
        return self.unit_kind[self.position_unit] * 2 + self.position_phase

    @cached_property
    def traced(self) -> np.ndarray:
        """Positions real runs record as fwd/bwd spans: all but the embeddings' backward."""
        t = np.ones(self.positions, dtype=bool)
        t[-1] = False
        return t


def doc_features(doc_lens: list[int], knots: tuple[float, ...] = ()) -> np.ndarray:
    """What a packed microbatch's compute is a linear function of: [1, tokens, sum len^2] and,
    per knot k, sum max(0, len - k)^2.

    Attention runs per document, hence the squares. The knot terms let the cost per squared
    token rise past a length, as it does on this CPU, where a document's attention matrix
    outgrows the caches: fitted without knots on calibration runs of both length profiles,
    the tiny model's layers came out 35% too fast on documents under 300 tokens (the fit
    follows the long ones), with knots within 0.1%. Non-negative coefficients keep the cost
    increasing and convex in every document's length.
    """
    lens = np.asarray(doc_lens, dtype=float)
    hinge = [float((np.maximum(lens - k, 0.0) ** 2).sum()) for k in knots]
    return np.array([1.0, lens.sum(), (lens * lens).sum(), *hinge])

