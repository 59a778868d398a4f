"""dataset=grpo in the harness: its lengths reach the plan, PPO minibatches hold whole groups, and
the RL series of Fig. 9 plan as verl would run them."""

import numpy as np
import pytest

from odc_bench.config.dataset import GrpoConfig
from odc_bench.data.lengths import minibatch_samples
from odc_bench.data.rl import grpo_lengths, grpo_max_len
from odc_bench.errors import ConfigError
from tests.helpers import run_config, run_spec

CPU_SCALE = "dataset.length_scale=0.015625"
G = GrpoConfig().group_size


def _groups(ids: list[int], g: int) -> list[int]:
    """The prompts a minibatch's sample ids belong to, checking that each comes as a whole group."""
    prompts = []
    for start in range(0, len(ids), g):
        group = ids[start:start + g]
        assert group == list(range(group[0], group[0] + g)) and group[0] % g == 0, "a group is consecutive ids"
        prompts.append(group[0] // g)
    return prompts


def test_the_run_trains_on_the_grpo_lengths_in_whole_groups():
    spec = run_spec("dataset=grpo", CPU_SCALE, "minibatch_size=16", "num_minibatches=5")
    cfg = spec.config.dataset
    pool = grpo_lengths(spec.config.seed, cfg.grpo, cfg.length_scale)
    assert spec.max_tokens == grpo_max_len(cfg.grpo, cfg.length_scale), "packing ratio 1: prompt + generation limits"
    for mb in spec.minibatches:
        assert len(mb.sample_ids) == 2 * 16
        prompts = _groups(mb.sample_ids, G)
        assert len(prompts) == len(set(prompts)) == 2 * 16 // G
        assert mb.lengths == [int(pool[i]) for i in mb.sample_ids]
    seen = [p for mb in spec.minibatches for p in _groups(mb.sample_ids, G)]
    assert len(set(seen)) == len(seen), "no prompt twice before the pool wraps"


def test_group_size_sets_the_granularity():
    spec = run_spec("dataset=grpo", CPU_SCALE, "minibatch_size=3", "dataset.grpo.group_size=2", "num_minibatches=3",
                    "dataset.grpo.num_prompts=20")
    for mb in spec.minibatches:
        assert len(_groups(mb.sample_ids, 2)) == 3


@pytest.mark.parametrize(("global_size", "message"), [
    (24, "a minibatch of world_size x minibatch_size = 24 samples is not a multiple of 16"),
    (16 * 600, "needs 600 prompts, more than dataset.grpo.num_prompts=512"),
])
def test_a_minibatch_that_cannot_hold_whole_groups_is_refused(global_size, message):
    ds = run_config("dataset=grpo").dataset
    with pytest.raises(ConfigError, match=message):
        minibatch_samples(ds, 512 * G, global_size, 3, seed=0)


def test_sft_minibatches_are_still_a_permutation_of_the_pool():
    ds = run_config().dataset
    batches = minibatch_samples(ds, 10, 4, 5, seed=0)
    assert [len(b) for b in batches] == [4] * 5
    assert sorted(batches[0] + batches[1] + batches[2][:2]) == list(range(10)), "every sample once per pass"
    with pytest.raises(ConfigError, match="fewer than one minibatch"):
        minibatch_samples(ds, 3, 4, 1, seed=0)


def test_lb_mini_with_equal_samples_gives_every_rank_its_share_of_samples():
    spec = run_spec("dataset=grpo", CPU_SCALE, "minibatch_size=16", "num_minibatches=4", "engine=odc",
                    "balancer=lb_mini", "balancer.options.equal_samples=true")
    for mb in spec.minibatches:
        assert [sum(len(m) for m in rank) for rank in mb.plan] == [16, 16]


def test_the_fig9_series_plan_and_verl_keeps_microbatch_counts_equal():
    for balancer in ("verl", "lb_micro"):
        spec = run_spec("dataset=grpo", CPU_SCALE, "minibatch_size=16", "num_minibatches=4", f"balancer={balancer}")
        for mb in spec.minibatches:
            assert len({len(rank) for rank in mb.plan}) == 1
            assert sorted(i for rank in mb.plan for m in rank for i in m) == list(range(len(mb.lengths)))


def test_grpo_config_checks_its_values():
    with pytest.raises(ConfigError, match="group_size must be at least 1"):
        GrpoConfig(group_size=0)
    with pytest.raises(ConfigError, match="min_prompt_length"):
        GrpoConfig(min_prompt_length=2000)
    assert np.isclose(GrpoConfig().mean_sample, 9000), "the paper's mean sample"
