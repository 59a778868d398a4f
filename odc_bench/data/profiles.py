"""Sequence-length profiles of the paper's datasets.

The paper publishes summary numbers and plots (Fig. 7), not the per-sample lengths, so each
profile is a log-normal fitted to the published mean and bounded to the dataset's published
range; its spread (sigma) is our assumption. Load the real data (odc_bench.data.real) when
exact lengths matter. Every published fact, with its source: docs/length_facts.md.

| profile   | published, with its source                                  | fitted here                        |
|-----------|-------------------------------------------------------------|------------------------------------|
| longalign | mean ~16.5K and max 64K in the paper's counting (the paper; | log-normal, sigma 0.60 (assumed),  |
|           | the reference's preprocess_dataset.py: R1-Distill tokenizer,| truncated to [8K, 64K]             |
|           | chat template; its --max_token_len 65536); "8k to 64k" in   |                                    |
|           | ChatGLM tokens (LongAlign, arXiv 2401.18058, section 3.2)   |                                    |
| swe_smith | mean ~34.7K (the paper; the reference tokenizes the stored  | log-normal, sigma 0.66 (assumed),  |
|           | messages string); SWE-smith's own fine-tuning cut at 32K    | truncated to [2K, 128K] (assumed)  |
|           | (its configs/train), so longer trajectories exist; no max   |                                    |
|           | or percentile published                                     |                                    |
| aime      | RL rollouts: mean ~9K, less long-tailed (the paper);        | log-normal, sigma 0.45, clipped to |
|           | responses stop at the generation limit (verl). i.i.d.;      | [512, 16K]: overlong responses     |
|           | dataset=grpo draws prompts x groups instead (data/rl.py)    | pile up at 16K                     |
| fixed     | (control) every sample at LongAlign's 64K maximum           | no spread: the balanced workload   |
| pareto    | (synthetic) a heavy power-law tail: what the minibatch      | Pareto, tail index 1.2, truncated  |
|           | barrier costs most on (stale-synchronous ODC,               | to [2K, 128K]: mean ~7.0K, median  |
|           | docs/staleness.md); no published source                     | ~3.6K, p99 ~66K                    |

LongAlign's floor is 8K since the sensitivity study (studies/sensitivity.py, docs/sensitivity.md):
the profile before it reached down to 1K, which put 18% of samples below the dataset's published
8K. With the published floor the simulator gives the paper's collective and LB-Mini bubbles and
LB-Mini's speedup at its 14B cell (bubble rates read as idle over busy time), which the 1K floor
did not, and the best match of every profile tried that keeps the published facts; ODC +
LB-Micro's speedup stays about half the paper's under all of them. SWE-smith's range is not
published: its [2K, 128K] and sigma are assumptions.

The pareto profile has no published source: P(length > x) falls as x^-1.2 from 2K tokens to
SWE-smith's 128K limit, so most samples are short and a few are up to 64 times the shortest;
at the paper's golden setting (8 ranks, 4 samples each, the 1.5B quadratic cost) the
per-minibatch lower bound alone idles about 68% of rank-time, against LongAlign's 8%
(`python -m odc_bench.tools.balancer_report --profile pareto`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LengthProfile:
    name: str
    mean: float
    sigma: float
    min_len: int
    max_len: int
    num_samples: int
    # "truncate": draws outside the range are redrawn (SFT corpora filtered by length);
    # "clip": draws above the range are cut to max_len (RL responses hitting the limit).
    bound: str = "truncate"
    # A share of samples drawn uniformly from [peak_from, max_len] instead of the log-normal
    # (documents cut at the maximum, or a second mode of long ones); the log-normal's mean is
    # fitted so that the whole draw keeps `mean`.
    peak_fraction: float = 0.0
    peak_from: int | None = None
    # > 0: a Pareto distribution with this tail index on [min_len, max_len] instead of the
    # log-normal (mean and sigma then only describe it).
    tail_index: float = 0.0

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        if self.tail_index > 0:
            # Inverse CDF of the Pareto truncated to [min_len, max_len].
            a, b, alpha = self.min_len, self.max_len, self.tail_index
            u = rng.random(n)
            return np.rint(a / (1 - u * (1 - (a / b) ** alpha)) ** (1 / alpha)).astype(np.int64)
        if self.sigma == 0:
            return np.full(n, round(self.mean), dtype=np.int64)
        mu = self._fit_mu()
        if self.bound == "clip":
            x = rng.lognormal(mu, self.sigma, n)
            return np.clip(np.rint(x), self.min_len, self.max_len).astype(np.int64)
        out = np.empty(0)
        while out.size < n:
            x = rng.lognormal(mu, self.sigma, 2 * n)
            out = np.concatenate([out, x[(x >= self.min_len) & (x <= self.max_len)]])
        out = out[:n]
        if self.peak_fraction > 0:
            peak = rng.random(n) < self.peak_fraction
            out[peak] = rng.uniform(self._peak_from, self.max_len, int(peak.sum()))
        return np.rint(out).astype(np.int64)

    @property
    def _peak_from(self) -> int:
        return self.max_len if self.peak_from is None else self.peak_from

    def body_mean(self) -> float:
        """The log-normal part's mean: what is left of `mean` after the mass near the maximum."""
        p = self.peak_fraction
        return (self.mean - p * (self._peak_from + self.max_len) / 2) / (1 - p)

    def _fit_mu(self) -> float:
        """The log-mean whose bounded distribution has the published mean (bisection)."""
        lo, hi = math.log(self.min_len), math.log(self.max_len)
        target = self.body_mean()
        if not self.min_len < target < self.max_len:
            raise ValueError(f"profile {self.name}: a mean of {self.mean} cannot hold {self.peak_fraction:.1%} of "
                             f"samples in [{self._peak_from}, {self.max_len}] with the rest in "
                             f"[{self.min_len}, {self.max_len}]")
        for _ in range(60):
            mid = (lo + hi) / 2
            if self._bounded_mean(mid) < target:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    def _bounded_mean(self, mu: float) -> float:
        grid = np.exp(np.linspace(mu - 8 * self.sigma, mu + 8 * self.sigma, 20001))
        pdf = np.exp(-((np.log(grid) - mu) ** 2) / (2 * self.sigma**2)) / grid
        w = pdf * np.gradient(grid)
        if self.bound == "clip":
            return float((np.clip(grid, self.min_len, self.max_len) * w).sum() / w.sum())
        inside = (grid >= self.min_len) & (grid <= self.max_len)
        return float((grid[inside] * w[inside]).sum() / w[inside].sum())


def pareto_mean(low: int, high: int, alpha: float) -> float:
    """The mean of a Pareto distribution with tail index alpha truncated to [low, high]."""
    tail = 1 - (low / high) ** alpha
    if alpha == 1:
        return low * math.log(high / low) / tail
    return alpha * low**alpha / tail * (low ** (1 - alpha) - high ** (1 - alpha)) / (alpha - 1)


PROFILES: dict[str, LengthProfile] = {
    "longalign": LengthProfile("longalign", mean=16_500, sigma=0.60, min_len=8_192, max_len=65_536,
                               num_samples=10_000),
    "swe_smith": LengthProfile("swe_smith", mean=34_700, sigma=0.66, min_len=2_048, max_len=131_072,
                               num_samples=5_000),
    "aime": LengthProfile("aime", mean=9_000, sigma=0.45, min_len=512, max_len=16_384,
                          num_samples=8_192, bound="clip"),
    "fixed": LengthProfile("fixed", mean=65_536, sigma=0.0, min_len=65_536, max_len=65_536, num_samples=1_024),
    "pareto": LengthProfile("pareto", mean=pareto_mean(2_048, 131_072, 1.2), sigma=0.0, min_len=2_048,
                            max_len=131_072, num_samples=8_192, tail_index=1.2),
}


def profile_lengths(name: str, length_scale: float, seed: int, num_samples: int | None = None) -> np.ndarray:
    """The dataset's lengths, scaled; the scale keeps the shape and shrinks every sample.

    Lengths are drawn once per (profile, seed), then scaled, so a smaller scale gives the
    same samples in proportion. Scaled lengths are at least 2 tokens (one labelled token).
    """
    if name not in PROFILES:
        raise KeyError(name)
    prof = PROFILES[name]
    raw = prof.sample(num_samples or prof.num_samples, np.random.default_rng(seed))
    return np.maximum(2, np.rint(raw * length_scale)).astype(np.int64)


def profile_max_len(name: str, length_scale: float) -> int:
    """The dataset's longest possible sample after scaling: the default microbatch limit."""
    return max(2, round(PROFILES[name].max_len * length_scale))
