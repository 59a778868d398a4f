from pathlib import Path

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from odc_bench.balancers.registry import BALANCERS
from odc_bench.config.compose import compose_runs
from odc_bench.errors import ConfigError, RunFailed
from odc_bench.jobs.primitives import plan_from_config
from odc_bench.jobs.train import run_training
from odc_bench.plan.spec import resolve
from odc_bench.run import slurm_task
from tests.helpers import REPO, odc_bench, run_config
from tests.helpers.real_data import write_hf_dataset, write_jsonl, write_tokenizer

CONF = REPO / "odc_bench" / "conf"
GROUP_OPTIONS = [(g.name, f.stem) for g in sorted(CONF.iterdir()) if g.is_dir() and g.name != "__pycache__"
                 for f in sorted(g.glob("*.yaml"))]


def required_overrides(group: str, option: str, tmp_path: Path) -> list[str]:
    """What an option needs besides itself: real data to load, an engine that can run it, whole groups."""
    if (group, option) == ("dataset", "jsonl"):
        return [f"dataset.path={write_jsonl(tmp_path / 'd.jsonl', [300 + 40 * i for i in range(64)])}"]
    if (group, option) == ("dataset", "hf_disk"):
        data = write_hf_dataset(tmp_path / "ds", [50 + 5 * i for i in range(64)])
        return [f"dataset.path={data}", f"dataset.tokenizer={write_tokenizer(tmp_path / 'tok')}"]
    if (group, option) == ("dataset", "grpo"):
        return ["minibatch_size=8"]  # 2 ranks x 8 = one prompt's group of 16 responses
    if group == "balancer" and not BALANCERS[option].equal_counts:
        return ["engine=odc"]
    return []


@pytest.mark.parametrize(("group", "option"), GROUP_OPTIONS)
def test_every_config_group_option_composes_and_resolves(group, option, tmp_path):
    config = run_config(f"{group}={option}", "num_minibatches=2", "warmup_minibatches=0",
                        *required_overrides(group, option, tmp_path))
    if group == "task":
        assert config.task == option
        if option == "primitives":
            assert plan_from_config(config).sizes, "the benchmark plan has sizes to measure"
            return
    spec = resolve(config)
    if group not in ("task", "backend/hardware"):
        assert getattr(spec.config, group).name == option
    assert len(spec.minibatches) == 2


def test_default_job_is_the_documented_one():
    spec = resolve(run_config())
    c = spec.config
    assert (c.model.name, c.world_size, c.dataset.profile) == ("tiny", 2, "longalign")
    assert c.dataset.length_scale < 1
    assert all(len(mb.lengths) == c.world_size * c.minibatch_size for mb in spec.minibatches)


def test_command_lines_composed_together_are_those_composed_alone():
    lines = [["engine=odc", "balancer=lb_mini", "minibatch_size=3"], ["sweep=demo"],
             ["model=qwen2_7b", "backend=sim", "backend/hardware=h100", "world_size=16"], []]
    assert compose_runs(lines) == [run_config(*line) for line in lines]


def test_resolve_is_deterministic():
    a, b = resolve(run_config()), resolve(run_config())
    assert a.run_id == b.run_id
    assert [(m.sample_ids, m.plan) for m in a.minibatches] == [(m.sample_ids, m.plan) for m in b.minibatches]


def test_the_collective_process_group_is_resolved_so_auto_and_its_choice_are_one_run():
    auto, shm, gloo = (resolve(run_config(f"engine.backend={b}")) for b in ("auto", "shm", "gloo"))
    assert auto.config.engine.options.backend == "shm", "CPU: FSDP2 on the shared-memory group"
    assert auto.run_id == shm.run_id != gloo.run_id
    sim = resolve(run_config("backend=sim", "backend/hardware=a100", "model=qwen2_1p5b"))
    assert sim.config.engine.options.backend == "auto", "the simulator models the transport itself"


@pytest.mark.skipif(torch.cuda.is_available(), reason="resolves for another host's GPUs: this host has its own")
def test_a_run_for_another_hosts_gpus_resolves_for_cuda_without_this_hosts():
    spec = resolve(run_config("engine=collective"), remote_cuda=True)
    assert spec.device_type == "cuda" and spec.config.engine.options.backend == "nccl"
    assert spec.memory_limit is None, "the job's node checks its own memory"
    assert spec.run_id != resolve(run_config("engine=collective")).run_id, "another run than the CPU one"
    with pytest.raises(ConfigError, match="balancer.cost_model=calibrated reads the calibration of the job's GPU"):
        resolve(run_config("balancer.cost_model=calibrated"), remote_cuda=True)
    assert resolve(run_config("device=cpu"), remote_cuda=True).device_type == "cpu", "device=cpu stays CPU"


def test_a_slurm_job_that_asked_for_gpus_fails_in_one_line_on_a_node_without_cuda(monkeypatch, tmp_path):
    monkeypatch.setattr(slurm_task, "in_task", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RunFailed, match=r"this SLURM job asked for GPUs \(hydra.launcher.gpus_per_node=8\) but its "
                                        r"node \S+ sees no CUDA device"):
        run_training(run_config(f"results_dir={tmp_path}"), job_gpus=8)
    assert not list(tmp_path.iterdir()), "nothing written"


def test_odc_on_a_gpu_takes_the_cuda_heap_and_refuses_a_cpu_transport_in_one_line():
    # The device is chosen on the host that runs the ranks; the engine's options are checked for it
    # whatever the transport asked for, so this holds on a CPU-only machine as on a GPU node.
    assert run_config("engine=odc").engine.for_device("cuda").options.transport == "cuda_ipc"
    assert run_config("engine=odc", "engine.transport=nvshmem").engine.for_device("cuda").options.transport == "nvshmem"
    for transport in ("shm", "mpi"):
        with pytest.raises(ConfigError) as refused:
            run_config("engine=odc", f"engine.transport={transport}").engine.for_device("cuda")
        line = str(refused.value)
        assert "\n" not in line and line == (f"engine=odc: transport {transport} holds cpu tensors, not cuda; "
                                             "choose auto or another transport")
    with pytest.raises(ConfigError, match="transport cuda_ipc holds cuda tensors, not cpu"):
        run_config("engine=odc", "engine.transport=cuda_ipc").engine.for_device("cpu")


@pytest.mark.parametrize(("override", "message"), [
    ("world_size=0", "world_size must be at least 1"),
    ("minibatch_size=0", "minibatch_size must be at least 1"),
    ("max_tokens=64", "over the microbatch limit max_tokens=64"),
    ("dataset.profile=nosuch", "unknown dataset profile 'nosuch'"),
])
def test_bad_input_is_a_config_error(override, message):
    with pytest.raises(ConfigError, match=message):
        resolve(run_config(override))


@pytest.mark.parametrize("override", ["world_size=0", "minibatch_size=0", "max_tokens=64",
                                      "dataset.profile=nosuch", "dataset=nosuch", "no_such_key=1",
                                      "world_size=1,2", "world_size=[1,"])
def test_bad_input_exits_2_with_one_line_and_no_row(override, results_dir, monkeypatch, capsys):
    monkeypatch.chdir(results_dir.parent)
    assert odc_bench(override, f"results_dir={results_dir}") == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("odc_bench: error: "), err
    assert not (results_dir / "runs.csv").exists()


def test_unknown_group_option_lists_the_choices(results_dir, monkeypatch, capsys):
    monkeypatch.chdir(results_dir.parent)
    assert odc_bench("engine=nosuch", f"results_dir={results_dir}") == 2
    assert "unknown engine option 'nosuch'; choose one of collective, odc" in capsys.readouterr().err


def test_a_chosen_sweep_is_the_only_one_hydra_copies_and_a_mistyped_one_lists_them_all(results_dir, monkeypatch,
                                                                                        capsys):
    """Hydra deep-copies its whole store at every composition: choosing a sweep stores that one
    alone, while a name of no sweep file still gets Hydra's list of every sweep."""
    from hydra.core.config_store import ConfigStore

    sweeps = sorted(p.stem for p in (REPO / "sweeps").glob("*.yaml"))
    compose_runs([["sweep=golden"], ["sweep=smoke"]])  # each its own sweep, under one initialisation
    assert sorted(ConfigStore.instance().repo["sweep"]) == ["golden.yaml", "smoke.yaml"]
    compose_runs([["sweep=smoke"]])
    assert list(ConfigStore.instance().repo["sweep"]) == ["smoke.yaml"]
    monkeypatch.chdir(results_dir.parent)
    assert odc_bench("sweep=smok", f"results_dir={results_dir}") == 2
    assert f"unknown sweep option 'smok'; choose one of {', '.join(sweeps)}" in capsys.readouterr().err


def test_a_refitted_length_profile_gives_its_runs_new_keys(monkeypatch):
    """A profile's definition lives in code: refitting it must not let a re-run sweep take the
    old profile's rows for the new one's."""
    from dataclasses import replace as replaced

    from odc_bench.data import profiles

    before = resolve(run_config())
    monkeypatch.setitem(profiles.PROFILES, "longalign", replaced(profiles.PROFILES["longalign"], min_len=1024))
    after = resolve(run_config())
    assert after.config == before.config and after.run_id != before.run_id


def test_the_limits_on_waiting_and_running_leave_the_key_as_config_yaml_gives_them():
    """timeout_s and deadline_s change nothing a run that ends measures: a sweep re-run with a
    longer timeout_s, to rerun what timed out, measured every run again under new keys."""
    from odc_bench.plan.identity import GUARDS

    assert {key: run_config().to_dict()[key] for key in GUARDS} == GUARDS, "rows at the defaults keep their keys"
    keys = {resolve(run_config(*limits)).run_id for limits in [(), ("timeout_s=600",), ("timeout_s=120.0",),
                                                                  ("deadline_s=3600", "timeout_s=30")]}
    assert len(keys) == 1
    assert resolve(run_config("seed=1")).run_id not in keys


@pytest.mark.parametrize("base,unused,read", [
    (("balancer.cost_model=linear",), ("balancer.quadratic_fit=7b",), ("balancer.cost_model=quadratic",)),
    (("balancer.cost_model=flops",), ("balancer.calibration=/nowhere/cal.json",), ()),
    (("backend=sim",), ("backend.recompute_mode=op", "backend.recompute_blocks=0.25"), ("backend.recompute=true",)),
    (("backend=sim", "backend.recompute=true"), ("backend.recompute_blocks=0.25",), ("backend.recompute_mode=blocks",)),
    (("backend=sim", "engine=collective"), ("backend.odc_gather_bytes=2", "backend.odc_fetch=nearest"),
     ("engine=odc",)),
    (("backend=sim",), ("threads_per_rank=1", "optim.lr=0.1", "optim.betas=[0.9,0.9]"), ()),
    (("backend=sim",), ("device=cpu", "compile=false"), ()),
    (("backend=sim",), ("device=cuda", "compile=true"), ()),
])
def test_a_setting_nothing_reads_keys_the_run_as_without_it_and_is_noted(base, unused, read, tmp_path, capsys,
                                                                            monkeypatch):
    """A sweep that sets it beside the choice that ignores it (`-m balancer.cost_model=linear,quadratic
    balancer.quadratic_fit=7b`) measured its linear run again under a key of its own, without a word."""
    assert resolve(run_config(*base, *unused)).run_id == resolve(run_config(*base)).run_id
    if read:
        assert resolve(run_config(*base, *unused, *read)).run_id != resolve(run_config(*base, *read)).run_id
    monkeypatch.chdir(tmp_path)
    assert odc_bench(*base, *unused, "backend=sim", "num_minibatches=2", "warmup_minibatches=0",
                     f"results_dir={tmp_path / 'r'}") == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("odc_bench: note: ")]
    assert sorted(n.split()[2] for n in notes) == sorted(unused)
    assert all(" has no effect here: only " in n and "; the run is the one without it (" in n for n in notes)


def test_data_rewritten_under_its_name_gives_its_runs_new_keys_and_a_copy_keeps_them(tmp_path):
    """The key named the data by its path alone: with max_tokens set (so the resolved config did
    not move with the lengths), a re-run sweep over rewritten data skipped its runs as done and
    kept the old data's rows."""
    data = tmp_path / "d.jsonl"
    overrides = ("dataset=jsonl", f"dataset.path={data}", "max_tokens=4096", "minibatch_size=2", "num_minibatches=3")

    def key(lines: list[object], *more: str) -> tuple[str, object]:
        write_jsonl(data, lines)
        spec = resolve(run_config(*overrides, *more))
        return spec.run_id, spec.config

    counts = [300 + 40 * i for i in range(64)]
    first, config = key(counts)
    assert key(list(counts)) == (first, config), "the same samples written again (a copy, a new time) keep the key"
    rewritten = key([n + 10 for n in counts])
    assert rewritten[1] == config and rewritten[0] != first
    ids = [[i % 7 + 1] * n for i, n in enumerate(counts)]
    trained = key(ids, "dataset.tokens=data")[0]
    assert key([[i % 5 + 1] * n for i, n in enumerate(counts)], "dataset.tokens=data")[0] != trained, \
        "the same lengths with other ids train on other tokens"
    assert key(ids, "dataset.tokens=data")[0] == trained


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=40))
def test_a_string_setting_reaches_hydra_intact_whatever_it_holds(value):
    """The what-if put a lengths file's path into `dataset.path=` as it was: one with a quote or
    a non-ASCII letter (l's.jsonl, /home/josé/) was refused as an override the user never wrote."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from odc_bench.config.compose import string_override

    assume("${" not in value)  # an interpolation, which OmegaConf resolves quoted or not
    assert OverridesParser.create().parse_override(string_override("dataset.path", value)).value() == value


def test_a_plain_path_stays_as_it_is():
    from odc_bench.config.compose import string_override

    assert string_override("dataset.path", "/data/my lengths.jsonl") == "dataset.path=/data/my lengths.jsonl"
    assert string_override("dataset.path", "/data/l's.jsonl") == "dataset.path='/data/l\\'s.jsonl'"
    assert string_override("dataset.field", "null") == "dataset.field='null'", "not read as None"


def test_a_quoted_tilde_in_a_path_setting_is_the_home_folder(monkeypatch, tmp_path):
    """The shell expands `results_dir=~/x` but not `'results_dir="~/x"'` (quoted, as Hydra asks of a
    value with a space): that made a folder named ~ in the working folder."""
    from tests.helpers import run_config

    monkeypatch.setenv("HOME", str(tmp_path))
    config = run_config("results_dir=\"~/my results\"", "checkpoint.dir=\"~/ckpt\"")
    assert config.results_dir == str(tmp_path / "my results")
    assert config.checkpoint.dir == str(tmp_path / "ckpt")


def test_a_checkpoint_dir_shared_by_two_results_folders_gives_each_its_own_checkpoints(tmp_path):
    """Two commands recording one config into two tables at once, with checkpoint.dir on one
    scratch disk, saved into one folder: one run failed on the other's files (CheckpointError:
    FileNotFoundError in step-5), or would have resumed from them."""
    from odc_bench.plan.identity import checkpoint_folder
    from tests.helpers import run_config

    shared = f"checkpoint.dir={tmp_path / 'scratch'}"
    a, a_again, b = (run_config(f"results_dir={tmp_path / name}", shared) for name in ("a", "a", "b"))
    run_id = "0123456789abcdef"
    assert checkpoint_folder(a, run_id) == checkpoint_folder(a_again, run_id), "a re-run resumes from its own"
    assert checkpoint_folder(a, run_id) != checkpoint_folder(b, run_id)
    assert {checkpoint_folder(c, run_id).parent for c in (a, b)} == {tmp_path / "scratch"}
    own = run_config(f"results_dir={tmp_path / 'a'}")
    assert checkpoint_folder(own, run_id) == tmp_path / "a" / "checkpoints" / run_id


def test_the_primitives_benchmark_is_not_refused_for_a_training_combination():
    """task=primitives plans no minibatch: `balancer=lb_mini` beside the default collective engine
    was refused for the microbatch counts a training run would give its ranks."""
    from odc_bench.errors import CombinationError
    from odc_bench.plan.spec import check_combination

    with pytest.raises(CombinationError, match="gives ranks different microbatch counts"):
        check_combination(run_config("balancer=lb_mini"))
    check_combination(run_config("task=primitives", "balancer=lb_mini"))
