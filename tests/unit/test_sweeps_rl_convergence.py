"""The Fig. 9 and convergence sweeps expand to the runs their figures need."""

from omegaconf import OmegaConf

from odc_bench.cli.sweeper import sweep_jobs
from tests.helpers import compose_config

RL_SERIES = {("collective", "verl"), ("collective", "lb_micro"), ("odc", "lb_micro"), ("odc", "lb_mini")}


def jobs_of(name: str) -> list[dict[str, str]]:
    sweeper = OmegaConf.to_container(compose_config(f"sweep={name}", hydra=True).hydra.sweeper, resolve=True)
    return [dict(o.split("=", 1) for o in job) for job in sweep_jobs(sweeper)]


def test_fig9_is_three_models_four_minibatch_sizes_four_series_with_lb_mini_as_verl_dispatches():
    jobs = jobs_of("fig9_rl")
    assert {(j["engine"], j["balancer"]) for j in jobs} == RL_SERIES
    assert {(j["model"], j["world_size"]) for j in jobs} == {("qwen2_1p5b", "8"), ("qwen2_7b", "8"),
                                                             ("qwen2_14b", "16")}
    assert {j["minibatch_size"] for j in jobs} == {"4", "8", "16", "32"}
    assert len(jobs) == 3 * 4 * len(RL_SERIES)
    assert {j["dataset"] for j in jobs} == {"grpo"} and {j["backend"] for j in jobs} == {"sim"}
    mini = [j for j in jobs if j["balancer"] == "lb_mini"]
    assert mini and all(j["balancer.options.equal_samples"].lower() == "true" for j in mini)
    assert all(int(j["world_size"]) * int(j["minibatch_size"]) % 16 == 0 for j in jobs), "whole groups of 16"


def test_fig9_cpu_runs_the_same_series_on_two_local_ranks():
    jobs = jobs_of("fig9_rl_cpu")
    assert {(j["engine"], j["balancer"]) for j in jobs} == RL_SERIES
    assert len(jobs) == 2 * 3 * len(RL_SERIES)
    assert {j["results_dir"] for j in jobs} == {"results/cpu_rl"}
    assert "backend" not in jobs[0], "local ranks, the default backend"


def test_convergence_is_three_series_in_two_precisions_on_the_learnable_source():
    jobs = jobs_of("convergence")
    assert {(j["engine"], j["balancer"], j["precision"]) for j in jobs} == {
        (e, b, p) for e, b in [("collective", "lb_micro"), ("odc", "lb_mini"), ("odc", "lb_micro")]
        for p in ("fp32", "bf16")}
    assert {j["dataset.tokens"] for j in jobs} == {"learnable"}
    assert {int(j["num_minibatches"]) for j in jobs} == {300}
    assert "seed" not in jobs[0], "one seed: every series sees the same minibatches"
