"""Sample lengths of a GRPO workload: prompts, each answered by a group of G responses.

The paper trains GRPO in verl on AIME prompts, training time only (rollout not timed), with
DeepSeek-R1-Distill-Qwen models up to 14B on 16 GPUs; it publishes a mean sample length of
about 9K tokens and a plot (Fig. 7), not the lengths. A sample is one prompt plus one response
(verl trains on prompt + response, loss on the response). What is published and what is ours:

| quantity                        | default      | source                                            |
|---------------------------------|--------------|---------------------------------------------------|
| mean sample (prompt + response) | 9,000 tokens | the paper ("about 9K")                            |
| group size G (rollout.n)        | 16           | verl's DAPO recipe for AIME; paper: not published |
| prompts in the pool             | 512          | one training batch of verl's DAPO recipe; paper:  |
|                                 |              | not published                                     |
| prompts per PPO minibatch       | derived      | world_size x minibatch_size / G in the harness;   |
|                                 |              | 32 in verl's DAPO recipe; paper: not published    |
| generation limit                | 16,384       | ours, as profiles.py's aime; DAPO: 20,480;        |
|                                 |              | paper: not published                              |
| share of responses cut there    | 10%          | ours; not published                               |
| log-scale correlation in group  | 0.5          | ours (a hard prompt makes all answers long)       |
| prompt length                   | log-normal,  | ours, an AIME problem in a chat template; verl's  |
|                                 | median 160,  | examples allow 1,024-2,048 prompt tokens          |
|                                 | sigma 0.4,   |                                                   |
|                                 | [32, 1,024]  |                                                   |

Responses are log-normal before the cut: the two published-or-chosen numbers, the mean after
cutting and the share cut, fix both parameters (`fit_response`). Each prompt draws one
difficulty shared by its G responses and each response its own noise, split so that the
marginal stays that log-normal and a fraction `group_correlation` of the log-variance is shared.
Responses at or beyond the limit become exactly the limit (a point mass, as in verl when
generation stops at max_response_length).

Every value is a config key, `dataset.grpo.*` (conf/dataset/grpo.yaml, config/dataset.py's
GrpoConfig); the harness draws PPO minibatches of whole groups (`group_minibatches`).
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from odc_bench.config.dataset import GrpoConfig
from odc_bench.errors import ConfigError

_NORMAL = NormalDist()


def fit_response(mean: float, clip_fraction: float, limit: int) -> tuple[float, float]:
    """(mu, sigma) of the log-normal whose draws, cut at `limit`, average `mean` with `clip_fraction` cut.

    P(X >= limit) = c puts log(limit) at mu + sigma z, z the (1 - c) normal quantile, and then
    E[min(X, limit)] = limit (exp(sigma^2 / 2 - sigma z) Phi(z - sigma) + c), which falls from
    `limit` towards `c limit` as sigma grows: bisection finds sigma.
    """
    if not 0 < clip_fraction < 1:
        raise ValueError(f"clip_fraction must be in (0, 1), got {clip_fraction}")
    if not clip_fraction * limit < mean < limit:
        raise ValueError(f"a mean of {mean} with {clip_fraction:.0%} cut at {limit} is impossible: "
                         f"it must lie between {clip_fraction * limit:.0f} and {limit}")
    z = _NORMAL.inv_cdf(1 - clip_fraction)

    def clipped_mean(sigma: float) -> float:
        return limit * (math.exp(sigma * sigma / 2 - sigma * z) * _NORMAL.cdf(z - sigma) + clip_fraction)

    lo, hi = 1e-6, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if clipped_mean(mid) > mean else (lo, mid)
    sigma = (lo + hi) / 2
    return math.log(limit) - sigma * z, sigma


def mean_prompt(spec: GrpoConfig) -> float:
    """The prompt's mean after bounding (by quadrature: a few thousand points suffice)."""
    q = (np.arange(4096) + 0.5) / 4096
    z = np.array([_NORMAL.inv_cdf(float(p)) for p in q])
    x = np.clip(spec.prompt_median * np.exp(spec.prompt_sigma * z), spec.min_prompt_length, spec.max_prompt_length)
    return float(x.mean())


def response_fit(spec: GrpoConfig) -> tuple[float, float]:
    """The responses' log-normal; ConfigError, in one line naming the settings, where the mean
    sample cannot be drawn (fit_response's bounds on the response's mean, shifted by the prompt's)."""
    prompt, cut, limit = mean_prompt(spec), spec.clip_fraction, spec.max_response_length
    if not cut * limit < spec.mean_sample - prompt < limit:
        raise ConfigError(f"dataset.grpo.mean_sample={spec.mean_sample:g} cannot be drawn: with prompts of "
                          f"{prompt:.0f} tokens on average and dataset.grpo.clip_fraction={cut:g} of the responses cut "
                          f"at dataset.grpo.max_response_length={limit}, it must lie between "
                          f"{prompt + cut * limit:.0f} and {prompt + limit:.0f}; change one of them")
    return fit_response(spec.mean_sample - prompt, cut, limit)


AIME = GrpoConfig()


def grpo_draw(seed: int, spec: GrpoConfig = AIME, num_prompts: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Full-scale prompt lengths [prompts] and response lengths [prompts, G] of one pool."""
    prompts = num_prompts or spec.num_prompts
    rng = np.random.default_rng(seed)
    prompt = np.clip(np.rint(spec.prompt_median * np.exp(spec.prompt_sigma * rng.standard_normal(prompts))),
                     spec.min_prompt_length, spec.max_prompt_length).astype(np.int64)
    mu, sigma = response_fit(spec)
    shared = math.sqrt(spec.group_correlation) * rng.standard_normal((prompts, 1))
    own = math.sqrt(1 - spec.group_correlation) * rng.standard_normal((prompts, spec.group_size))
    response = np.clip(np.rint(np.exp(mu + sigma * (shared + own))), 1, spec.max_response_length)
    return prompt, response.astype(np.int64)


def grpo_lengths(seed: int, spec: GrpoConfig = AIME, length_scale: float = 1.0,
                 num_prompts: int | None = None) -> np.ndarray:
    """Sample lengths (prompt + response), group by group: samples g*G .. g*G + G-1 share prompt g.

    Drawn at full scale, then scaled (at least 2 tokens), so a smaller scale keeps the shape.
    """
    prompt, response = grpo_draw(seed, spec, num_prompts)
    lengths = (prompt[:, None] + response).reshape(-1)
    return np.maximum(2, np.rint(lengths * length_scale)).astype(np.int64)


def grpo_max_len(spec: GrpoConfig = AIME, length_scale: float = 1.0) -> int:
    """The longest possible sample after scaling: the default microbatch limit."""
    return max(2, round((spec.max_prompt_length + spec.max_response_length) * length_scale))


def group_minibatches(num_prompts: int, group_size: int, prompts_per_minibatch: int, num_minibatches: int,
                      seed: int) -> list[list[int]]:
    """Sample ids of each PPO minibatch: whole groups, a seeded permutation of prompts read in order.

    GRPO normalises advantages within a group and verl splits the training batch into PPO
    minibatches of whole groups (ppo_mini_batch_size prompts x rollout.n), so a minibatch never
    holds part of a group; sample ids follow grpo_lengths' layout.
    """
    order = np.random.default_rng(seed + 1).permutation(num_prompts)
    minibatches = []
    for k in range(num_minibatches):
        chosen = [int(order[(k * prompts_per_minibatch + j) % num_prompts]) for j in range(prompts_per_minibatch)]
        minibatches.append([p * group_size + r for p in chosen for r in range(group_size)])
    return minibatches
