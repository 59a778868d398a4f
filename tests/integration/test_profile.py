"""profile_minibatch: one warm-up minibatch of a real run under torch.profiler, each rank's
operator table and Chrome trace under <results_dir>/profiles/<run_id>/."""

from __future__ import annotations

import gzip
import json

import pytest

from odc_bench.errors import ConfigError
from odc_bench.plan.identity import config_key
from odc_bench.plan.spec import resolve
from odc_bench.run.local import run_local
from tests.helpers import run_config

SMALL = ("model.num_layers=2", "minibatch_size=2", "num_minibatches=2", "warmup_minibatches=1",
         "dataset.length_scale=0.005")


def test_each_rank_writes_the_profiled_minibatchs_table_and_trace(tmp_path):
    spec = resolve(run_config(*SMALL, "profile_minibatch=0", f"results_dir={tmp_path}"))
    run_local(spec)
    folder = tmp_path / "profiles" / spec.run_id
    assert sorted(p.name for p in folder.iterdir()) == ["rank0.trace.json.gz", "rank0.txt",
                                                          "rank1.trace.json.gz", "rank1.txt"]
    for rank in (0, 1):
        table = (folder / f"rank{rank}.txt").read_text()
        assert table.startswith(f"run {spec.run_id}, rank {rank}, minibatch 0, commit ")
        assert "aten::mm" in table and "Self CPU" in table, "the minibatch's matrix multiplies, by self time"
        events = json.loads(gzip.decompress((folder / f"rank{rank}.trace.json.gz").read_bytes()))["traceEvents"]
        assert any(e.get("name") == "aten::mm" for e in events)


def test_profiling_changes_no_run_key():
    assert config_key(run_config(*SMALL, "profile_minibatch=0")) == config_key(run_config(*SMALL))


@pytest.mark.parametrize(("overrides", "message"), [
    (("profile_minibatch=1",), "profile_minibatch must be a warm-up minibatch, 0 to warmup_minibatches - 1 (0)"),
    (("profile_minibatch=-1",), "profile_minibatch must be a warm-up minibatch"),
    (("profile_minibatch=0", "backend=sim"), "backend=sim has no device to profile"),
])
def test_a_profile_outside_the_warm_up_or_of_a_simulation_is_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as refused:
        run_config(*SMALL, *overrides)
    assert "\n" not in str(refused.value)
