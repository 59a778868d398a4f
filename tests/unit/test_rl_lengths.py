import math

import numpy as np
import pytest

from odc_bench.config.dataset import GrpoConfig
from odc_bench.data.rl import AIME, fit_response, group_minibatches, grpo_draw, grpo_lengths, grpo_max_len

# Many prompts, so that pool statistics sit close to the targets: with a group correlation of
# 0.5 the group means vary by about 30%, so the pool mean's standard error is about
# 0.3 / sqrt(4096) = 0.5%, and the tolerances below are about 4 standard errors.
PROMPTS = 4096


def test_shape_and_group_layout():
    lengths = grpo_lengths(0)
    assert lengths.shape == (AIME.num_prompts * AIME.group_size,) and lengths.dtype == np.int64
    prompt, response = grpo_draw(0)
    assert response.shape == (AIME.num_prompts, AIME.group_size)
    g = AIME.group_size
    for p in (0, 1, AIME.num_prompts - 1):
        assert (lengths[p * g:(p + 1) * g] == prompt[p] + response[p]).all(), "a group's samples are consecutive"


def test_deterministic_in_the_seed():
    assert np.array_equal(grpo_lengths(3), grpo_lengths(3))
    assert not np.array_equal(grpo_lengths(3), grpo_lengths(4))
    assert np.array_equal(grpo_lengths(3, num_prompts=64), grpo_lengths(3, num_prompts=64))


def test_mean_sample_is_the_papers():
    assert grpo_lengths(0, num_prompts=PROMPTS).mean() == pytest.approx(AIME.mean_sample, rel=0.02)


def test_a_point_mass_at_the_generation_limit():
    prompt, response = grpo_draw(0, num_prompts=PROMPTS)
    assert response.max() == AIME.max_response_length
    assert (response == AIME.max_response_length).mean() == pytest.approx(AIME.clip_fraction, abs=0.015)
    assert (response == AIME.max_response_length - 1).mean() < 0.01, "a mass at the limit, not a pile near it"
    lengths = grpo_lengths(0, num_prompts=PROMPTS)
    assert lengths.max() <= grpo_max_len()
    assert AIME.min_prompt_length <= prompt.min() and prompt.max() <= AIME.max_prompt_length


def test_group_members_share_their_prompts_difficulty():
    _, response = grpo_draw(1, num_prompts=PROMPTS)
    logs = np.log(response)
    within = logs.var(axis=1, ddof=1).mean()
    total = logs.var()
    # Clipping flattens the top, so the shared share is near, not at, group_correlation.
    assert 0.35 < 1 - within / total < 0.6
    independent = grpo_draw(1, GrpoConfig(group_correlation=0.0), num_prompts=PROMPTS)[1]
    assert abs(1 - np.log(independent).var(axis=1, ddof=1).mean() / np.log(independent).var()) < 0.05


def test_fit_response_gives_the_requested_mean_and_cut():
    mu, sigma = fit_response(mean=6_000, clip_fraction=0.2, limit=8_192)
    x = np.exp(mu + sigma * np.random.default_rng(0).standard_normal(400_000))
    assert (x >= 8_192).mean() == pytest.approx(0.2, abs=0.003)
    assert np.minimum(x, 8_192).mean() == pytest.approx(6_000, rel=0.005)
    with pytest.raises(ValueError, match="impossible"):
        fit_response(mean=1_000, clip_fraction=0.2, limit=8_192)
    with pytest.raises(ValueError, match="clip_fraction"):
        fit_response(mean=5_000, clip_fraction=0.0, limit=8_192)


def test_length_scale_keeps_the_shape():
    full = grpo_lengths(0)
    small = grpo_lengths(0, length_scale=1 / 64)
    assert np.array_equal(small, np.maximum(2, np.rint(full / 64)))
    assert grpo_max_len(length_scale=1 / 64) == math.ceil((1_024 + 16_384) / 64)


def test_minibatches_hold_whole_groups():
    g, per = AIME.group_size, 4
    batches = group_minibatches(num_prompts=10, group_size=g, prompts_per_minibatch=per, num_minibatches=5, seed=0)
    assert batches == group_minibatches(10, g, per, 5, seed=0)
    assert all(len(b) == per * g for b in batches)
    for b in batches:
        for start in range(0, len(b), g):
            group = b[start:start + g]
            assert group == list(range(group[0], group[0] + g)) and group[0] % g == 0
    first_epoch = [b[i] // g for b in batches[:2] for i in range(0, per * g, g)] + [batches[2][0] // g,
                                                                                    batches[2][g] // g]
    assert sorted(first_epoch) == list(range(10)), "every prompt once before any repeats"
