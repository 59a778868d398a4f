"""profile_minibatch: one warm-up minibatch of a real run under torch.profiler, each rank's
operator table and Chrome trace under <results_dir>/profiles/<run_id>/."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

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


def test_the_profilers_host_memory_is_not_the_runs_peak(tmp_path):
    """On CPU the profiler's records, its buffers and pandas (its table's) live in the ranks'
    heap, where peak memory is read: a profiled run's peak is the plain run's (before, 53 MB
    against 14 here)."""
    peaks = {}
    for name, extra in (("plain", ()), ("profiled", ("profile_minibatch=0",))):
        results = run_local(resolve(run_config(*SMALL, *extra, f"results_dir={tmp_path / name}")))
        peaks[name] = [r["peak_bytes"] for r in sorted(results, key=lambda r: r["rank"])]
    for plain, profiled in zip(peaks["plain"], peaks["profiled"], strict=True):
        assert profiled == pytest.approx(plain, rel=0.1), peaks


def test_what_a_rank_loads_for_good_is_loaded_before_its_memory_baseline():
    """Building the optimizer imports Dynamo, which the fork server preloads for forked ranks but
    MPI ranks and SLURM tasks import themselves: a rank loads it before its memory baseline, so
    the same run's peak does not depend on how its ranks were started (an MPI rank's counted
    Dynamo's heap, a forked rank's did not)."""
    code = ("import gc, torch\n"
            "from odc_bench.run.trace import heap_in_use_bytes\n"
            "from odc_bench.run.worker import load_before_baseline\n"
            "load_before_baseline(False, torch.device('cpu'))\n"
            "gc.collect(); before = heap_in_use_bytes()\n"
            "torch.optim.AdamW([torch.nn.Parameter(torch.zeros(4))])\n"
            "gc.collect(); print(heap_in_use_bytes() - before)\n")
    grown = int(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
    assert grown < 1 << 20, f"building an optimizer after the baseline allocated {grown / 2**20:.1f} MiB"


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


def test_the_table_counts_self_time_without_nested_operators_and_kernels_by_device_time():
    from odc_bench.run.profile import operator_table

    def op(name, ts, dur, tid=1, cat="cpu_op"):
        return dict(ph="X", name=name, cat=cat, ts=ts, dur=dur, pid=7, tid=tid)

    events = [op("outer", 0, 100), op("inner", 10, 30), op("leaf", 15, 5), op("inner", 50, 20),
              op("other thread", 20, 40, tid=2), dict(ph="i", name="marker", ts=5),
              op("gemm", 12, 8, tid=9, cat="kernel"), op("gemm", 60, 4, tid=9, cat="kernel"),
              op("copy", 70, 3, tid=9, cat="gpu_memcpy")]
    text = operator_table(events)
    busy, device, host = text.split("\n\n")
    # 0 to 100 µs; kernels at 12-20, 60-64 and 70-73, and one inside another counted once
    assert busy.startswith("Span 0.100 ms, first event to last: the device busy 0.015 ms of it (15.0%;")
    assert "(15.0%;" in operator_table([*events, op("nested", 13, 2, tid=10, cat="kernel")])
    assert device.startswith("Device time by kernel (total 0.015 ms)")
    assert "     0.012  80.0%       2  gemm" in device and "     0.003  20.0%       1  copy" in device
    rows = {line.split()[-1]: line.split()[:3] for line in host.splitlines()[2:]}
    # of 140: outer 100 - (30 + 20) nested; inner 30 - 5 + 20; leaf 5; the other thread's 40
    assert rows["outer"] == ["0.050", "35.7%", "1"] and rows["inner"] == ["0.045", "32.1%", "2"]
    assert rows["leaf"][0] == "0.005" and rows["thread"][0] == "0.040"
    assert "Device time" not in operator_table(events[:5]), "no kernels on the CPU: host time only"
