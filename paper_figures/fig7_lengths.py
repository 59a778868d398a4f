"""Fig. 7 analog: sequence-length distributions of the datasets.

The paper's dataset profiles are metadata, not training, so they are drawn directly from
odc_bench.data.profiles at paper scale (length_scale 1, seed 0), and the RL panel from the GRPO
workload Fig. 9 trains on (odc_bench.data.rl, its default pool: prompts x groups of 16). Real datasets'
lengths (`lengths/*.npy` below the results root, or `--lengths FILE` in any format the what-if reads) get a
panel each, titled with the data's name.
The long right tails are what makes fixed packing leave devices idle.
"""

from __future__ import annotations

import sys

import numpy as np
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from odc_bench.data.profiles import PROFILES, profile_lengths
from odc_bench.data.rl import grpo_lengths
from paper_figures.inputs import Inputs

NAME = "fig7_lengths"
X_LABEL = "sequence length (tokens)"
Y_LABEL = "samples"
BINS = 50
# The paper's SFT datasets (Fig. 7); other profiles (controls such as fixed lengths, and aime,
# whose i.i.d. samples the GRPO workload replaces) are left out.
PAPER_PROFILES = ("longalign", "swe_smith")
RL_PANEL = "grpo (workload)"


def profiles(seed: int = 0) -> dict[str, np.ndarray]:
    drawn = {f"{name} (profile)": profile_lengths(name, 1.0, seed) for name in PAPER_PROFILES if name in PROFILES}
    return drawn | {RL_PANEL: grpo_lengths(seed)}


def _tokens(n: float) -> str:
    return f"{n / 1000:.3g}K" if n >= 1000 else f"{n:.0f}"


def plot(lengths: dict[str, np.ndarray], real: frozenset[str] = frozenset()) -> Figure:
    """One histogram per dataset; `real` names the datasets that are measured, not profiles."""
    fig = Figure(figsize=(3.6 * len(lengths), 3.2))
    axes = fig.subplots(1, len(lengths), squeeze=False)[0]
    for ax, (name, values) in zip(axes, lengths.items(), strict=True):
        sns.histplot(x=values, bins=BINS, ax=ax, color="#4c72b0" if name not in real else "#dd8452")
        mean = float(np.mean(values))
        ax.axvline(mean, color="black", ls="--", lw=1, gid="mean")
        ax.set_title(f"{name}\nmean {_tokens(mean)}, max {_tokens(values.max())}, n={len(values)}")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _tokens(v)))
        ax.set_xlabel(X_LABEL)
        ax.set_ylabel(Y_LABEL)
    fig.suptitle("Sequence-length distributions")
    fig.tight_layout()
    return fig


def render(inputs: Inputs) -> dict[str, object]:
    real = {f"{k} (real)": v for k, v in inputs.lengths.items()}
    return {NAME: plot(profiles() | real, frozenset(real))}


if __name__ == "__main__":
    from paper_figures.cli import main

    sys.exit(main(only=NAME))
