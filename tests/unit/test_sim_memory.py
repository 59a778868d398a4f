"""A simulated run over the simulated device's memory runs and says so in its row; a local run
over this host's memory is still refused before anything is written; so is a run whose draw,
plans or simulation this host cannot hold."""

import os
import tracemalloc
from functools import partial

import pandas as pd
import pytest

from odc_bench.data.lengths import DRAWN_SAMPLE_BYTES, POOL_SAMPLE_BYTES
from odc_bench.data.profiles import PROFILES, profile_lengths
from odc_bench.data.rl import AIME, grpo_lengths
from odc_bench.errors import ConfigError
from odc_bench.jobs.train import run_training
from odc_bench.plan.spec import SIMULATED_UNIT_BYTES, resolve
from odc_bench.sim import simulate
from tests.helpers import REPO, run_config

# 1.5B on 8 A100s at packing ratio 8: 512K tokens per microbatch, about 97 GiB by the estimate.
OVER = ("backend=sim", "backend/hardware=a100", "precision=bf16", "backend.recompute=true", "model=qwen2_1p5b",
        "world_size=8", "dataset.length_scale=1", "packing_ratio=8", "num_minibatches=2", "warmup_minibatches=0",
        "backend.write_trace=false")


def test_a_simulated_run_over_device_memory_runs_records_its_estimate_and_says_so(tmp_path, capsys):
    row = run_training(run_config(*OVER, f"results_dir={tmp_path}"))
    assert isinstance(row, dict) and row["status"] == "ok"
    table = pd.read_csv(tmp_path / "runs.csv")
    assert (table["mem_estimate_mb"] > table["mem_limit_mb"]).all()
    note = [line for line in capsys.readouterr().err.splitlines() if "would not fit" in line]
    assert len(note) == 1 and note[0].startswith("odc_bench: note: on the simulated GPUs this run would not fit: a "
                                                 "rank would need about ")
    assert "lower max_tokens" in note[0] and note[0].endswith("; the simulator answers it anyway")
    # One that fits says nothing of memory.
    run_training(run_config(*OVER, "packing_ratio=1", f"results_dir={tmp_path}"))
    assert "would not fit" not in capsys.readouterr().err


def test_a_local_run_over_this_hosts_memory_is_refused(tmp_path):
    config = run_config("model=qwen2_7b", "dataset.length_scale=1", f"results_dir={tmp_path}")
    with pytest.raises(ConfigError, match="a rank would need about"):
        run_training(config)
    assert not (tmp_path / "runs.csv").exists()


HUGE = 10**20


@pytest.mark.parametrize(("overrides", "said"), [
    (("backend=sim", f"dataset.num_samples={HUGE}"), "a pool of dataset.num_samples="),
    (("backend=sim", "dataset=grpo", f"dataset.grpo.num_prompts={HUGE}"), "a pool of dataset.grpo.num_prompts x"),
    (("backend=sim", "dataset=grpo", f"dataset.grpo.group_size={HUGE}"), "a pool of dataset.grpo.num_prompts x"),
    (("backend=sim", f"num_minibatches={HUGE}"), f"planning num_minibatches={HUGE} minibatches"),
    # More ranks than samples: the pool is what to name.
    (("backend=sim", f"world_size={HUGE}"), "the dataset has 10000 usable samples, fewer than one minibatch"),
    (("backend=sim", f"model.num_layers={HUGE}"), f"simulating model.num_layers={HUGE} layers"),
    ((f"model.num_layers={HUGE}",), "the model alone does not fit"),
])
def test_a_size_no_host_holds_is_refused_in_one_line_before_it_is_drawn_planned_or_listed(overrides, said):
    """Before, numpy's allocation error ended the command in a traceback, and a model's layers were
    listed one by one until the kernel killed the process."""
    with pytest.raises(ConfigError, match=said) as refused:
        resolve(run_config(*overrides)).check_fits()
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(("overrides", "said"), [
    (("dataset.length_scale=1e300",),
     r"dataset.length_scale=1e\+300 makes samples of up to 6.554e\+304 tokens, beyond"),
    (("dataset=grpo", "minibatch_size=8", "dataset.length_scale=1e15"),
     "dataset.length_scale=1000000000000000.0 makes"),
    (("dataset=jsonl", f"dataset.path={REPO / 'examples/lengths.jsonl'}", "dataset.length_scale=1e300"),
     "beyond any sequence"),
    (("packing_ratio=1e300",),
     r"a microbatch limit of 1.024e\+303 tokens \(the longest sample x packing_ratio=1e\+300\) is beyond what any "
     r"device holds \(limits are below 2147483648\); lower packing_ratio"),
    (("max_tokens=2147483648",), r"limit of 2147483648 tokens \(max_tokens\) is beyond .*; lower max_tokens$"),
])
def test_a_sample_or_microbatch_longer_than_any_sequence_is_refused_in_one_line(overrides, said):
    """Before, a scale past int64 ended in a traceback (OverflowError) or wrapped round (max_tokens
    "got -9223372036854775808"), and one short of it simulated samples of 10^19 tokens."""
    with pytest.raises(ConfigError, match=said):
        resolve(run_config("backend=sim", *overrides))


def _peak(work) -> int:
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_least_the_host_check_counts_is_no_more_than_a_draw_a_plan_and_a_simulation_take():
    """The check refuses what cannot fit, never what can: each item's bytes it counts are at
    most what the smallest runs take per item (a minibatch of one sample, one rank)."""
    n = 20_000
    for name in PROFILES:
        assert _peak(partial(profile_lengths, name, 1.0, 0, n)) >= n * POOL_SAMPLE_BYTES, name
    assert _peak(partial(grpo_lengths, 0, num_prompts=n // AIME.group_size)) >= n * POOL_SAMPLE_BYTES
    small = ("backend=sim", "world_size=1", "minibatch_size=1", "warmup_minibatches=0", "backend.write_trace=false")
    few, many = (run_config(*small, f"num_minibatches={count}") for count in (100, 2100))
    assert _peak(partial(resolve, many)) - _peak(partial(resolve, few)) >= 2000 * DRAWN_SAMPLE_BYTES
    few, many = (resolve(run_config(*small, "num_minibatches=1", f"model.num_layers={layers}")) for layers in (50, 450))
    assert _peak(partial(simulate, many, trace=False)) - _peak(partial(simulate, few, trace=False)) >= \
        400 * SIMULATED_UNIT_BYTES


def test_the_host_checks_run_where_there_is_no_proc_meminfo(tmp_path, monkeypatch):
    """The what-if and the simulator run on macOS too, which has no /proc/meminfo: there the
    checks count the host's physical memory."""
    from odc_bench import sizes

    monkeypatch.setattr(sizes, "MEMINFO", tmp_path / "meminfo")
    assert sizes.host_available_bytes() == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert resolve(run_config("backend=sim")).world_size == 2
    (tmp_path / "meminfo").write_text("MemTotal:       1000 kB\n")  # a kernel before MemAvailable (3.14)
    assert sizes.host_available_bytes() == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
