"""Every sweep file composes, expands to the jobs its experiment needs, and each job resolves."""

import re
import tracemalloc

import pytest
from omegaconf import OmegaConf

from odc_bench.cli.precheck import SWEEP_JOB_BYTES
from odc_bench.cli.sweeper import expand_jobs, interleave, sweep_jobs
from odc_bench.plan.spec import resolve
from odc_bench.results.table import read_table
from tests.helpers import REPO, compose_config, odc_bench, run_config

SWEEPS = sorted(p.stem for p in (REPO / "sweeps").glob("*.yaml"))
GOLDEN = {"model": "qwen2_1p5b", "dataset": "longalign", "minibatch_size": "4", "world_size": "8",
          "packing_ratio": "1", "dataset.length_scale": "1.0"}
SERIES = {("collective", "local_sort"), ("collective", "lb_micro"), ("odc", "local_sort"), ("odc", "lb_micro"),
          ("odc", "lb_mini")}


def sweeper_config(name: str) -> dict:
    cfg = compose_config(f"sweep={name}", hydra=True)
    assert cfg.hydra.mode.name == "MULTIRUN", f"sweeps/{name}.yaml must set hydra.mode: MULTIRUN"
    return OmegaConf.to_container(cfg.hydra.sweeper, resolve=True)


def jobs_of(name: str) -> list[dict[str, str]]:
    return [dict(o.split("=", 1) for o in job) for job in sweep_jobs(sweeper_config(name))]


# Keys whose values make replicas of one run (its seed, how many runs of it a table should
# hold): they change neither which files compose nor what resolving checks.
REPLICA_KEYS = ("seed", "repeat")


def covering_subset(jobs: list[list[str]]) -> list[list[str]]:
    """Jobs that between them use every value of every swept key: a big sweep's representatives.
    A job that is a replica of one already chosen (it differs only in REPLICA_KEYS) adds nothing."""
    seen: set[str] = set()
    runs: set[frozenset[str]] = set()
    chosen = []
    for job in jobs:
        run = frozenset(o for o in job if o.split("=", 1)[0] not in REPLICA_KEYS)
        if not set(job) <= seen and run not in runs:
            chosen.append(job)
            runs.add(run)
            seen |= set(job)
    return chosen


def test_the_paper_sweeps_exist():
    assert {"smoke", "golden", "fig8_sft", "fig10", "primitives"} <= set(SWEEPS)


def test_every_sweep_file_says_what_it_feeds_and_at_what_scale():
    for name in SWEEPS:
        text = (REPO / "sweeps" / f"{name}.yaml").read_text()
        comment = " ".join(line for line in text.splitlines() if line.startswith("#")).lower()
        assert "scale" in comment, f"sweeps/{name}.yaml: say at what scale it runs here"
        assert any(w in comment for w in ("fig.", "table", "no figure")), f"sweeps/{name}.yaml: say what it feeds"


def test_smoke_is_three_tiny_collective_runs_on_two_ranks():
    jobs = jobs_of("smoke")
    assert len(jobs) == 3
    assert {(j["model"], j["engine"], j["balancer"], j["world_size"]) for j in jobs} == {
        ("tiny", "collective", "local_sort", "2")}
    assert sorted(j["minibatch_size"] for j in jobs) == ["1", "2", "4"]


def test_fig8_is_models_datasets_minibatches_times_the_five_valid_series():
    jobs = jobs_of("fig8_sft")
    assert {(j["engine"], j["balancer"]) for j in jobs} == SERIES
    models = {j["model"] for j in jobs}
    assert models == {"qwen2_1p5b", "qwen2_7b", "qwen2_14b", "qwen2_32b"}
    assert {j["dataset"] for j in jobs} == {"longalign", "swe_smith"}
    assert {j["minibatch_size"] for j in jobs} == {"1", "2", "4", "8"}
    assert len(jobs) == len(models) * 2 * 4 * len(SERIES)
    assert {j["backend"] for j in jobs} == {"sim"}


def _factors_off_golden(job: dict[str, str]) -> set[str]:
    return {k for k, v in GOLDEN.items() if job.get(k, v) != v}


def test_golden_is_table1_and_one_factor_variations_for_every_series():
    jobs = jobs_of("golden")
    golden = [j for j in jobs if not _factors_off_golden(j)]
    assert {(j["engine"], j["balancer"]) for j in golden} == SERIES
    assert all(len(_factors_off_golden(j)) <= 1 for j in jobs)
    varied = {next(iter(_factors_off_golden(j))) for j in jobs if _factors_off_golden(j)}
    assert varied == set(GOLDEN), "every factor of the golden setting is varied"
    points = {tuple(sorted((k, j[k]) for k in GOLDEN)) for j in jobs}
    assert len(jobs) == len(points) * len(SERIES), "every point runs every series once"


def test_fig10_varies_the_four_factors_one_at_a_time():
    jobs = jobs_of("fig10")
    assert all(len(_factors_off_golden(j)) <= 1 for j in jobs)
    axis = {k: {j[k] for j in jobs} for k in ("minibatch_size", "dataset.length_scale", "packing_ratio", "world_size")}
    assert axis["minibatch_size"] == {"1", "2", "4", "8", "16"}
    assert axis["dataset.length_scale"] == {"0.125", "0.25", "0.5", "1.0", "2.0"}  # 8K to 128K
    assert axis["packing_ratio"] == {"1", "2", "4", "8"}
    assert axis["world_size"] == {"4", "8", "16", "32"}
    series = {(j["engine"], j["balancer"]) for j in jobs}
    assert series == {("collective", "lb_micro"), ("odc", "lb_micro"), ("odc", "lb_mini")}
    assert len(jobs) == len({tuple(sorted(j.items())) for j in jobs})


def test_sim_scaling_runs_every_layout_from_one_node_to_128():
    jobs = jobs_of("sim_scaling")
    layout = {(j["engine"], j.get("engine.shard", "full"), j.get("backend.odc_fetch", "owner")) for j in jobs}
    assert layout == {("collective", "full", "owner"), ("collective", "hybrid", "owner"), ("odc", "full", "owner"),
                      ("odc", "hybrid", "owner"), ("odc", "full", "nearest")}
    assert {j["world_size"] for j in jobs} == {str(8 * 2**i) for i in range(8)}
    assert {(j["model"], j["dataset"]) for j in jobs} == {(m, d) for m in ("qwen2_1p5b", "qwen2_32b")
                                                          for d in ("longalign", "swe_smith")}
    assert {(j["engine"], j["balancer"]) for j in jobs} == {("collective", "lb_micro"), ("odc", "lb_mini")}
    assert len(jobs) == 160 == len({tuple(sorted(j.items())) for j in jobs})


def test_primitives_runs_the_primitives_task_on_two_and_four_ranks():
    jobs = jobs_of("primitives")
    assert {j["task"] for j in jobs} == {"primitives"}
    assert sorted(j["world_size"] for j in jobs) == ["2", "4"]


def test_balanced_control_runs_each_seed_as_a_pair_of_engines_in_alternating_order():
    """The median over side-by-side pairs is only fair if neither engine always runs second."""
    jobs = jobs_of("odc_engine_balanced")
    assert {(j["dataset"], j["dataset.length_scale"]) for j in jobs} == {("fixed", "0.0625")}
    seeds = [j["seed"] for j in jobs]
    assert len(set(seeds)) >= 5 and all(seeds[k] == seeds[k + 1] for k in range(0, len(seeds), 2))
    pairs = [(jobs[k]["engine"], jobs[k + 1]["engine"]) for k in range(0, len(jobs), 2)]
    assert set(pairs) == {("collective", "odc"), ("odc", "collective")}
    assert sum(p[0] == "odc" for p in pairs) in (len(pairs) // 2, (len(pairs) + 1) // 2)


@pytest.mark.slow
@pytest.mark.parametrize("name", SWEEPS)
def test_every_job_of_every_sweep_composes_and_resolves_to_its_parameters(name):
    """All jobs of small sweeps, a covering subset (every swept value at least once, replicas of
    one run once) of big ones.

    Needs every option the sweeps name (engine=odc, lb_micro/lb_mini, backend=sim,
    task=primitives): until those land, the sweeps that use them fail here by design.
    """
    for job in covering_subset(sweep_jobs(sweeper_config(name))):
        config = run_config(f"sweep={name}", *job)
        as_run = OmegaConf.create(resolve(config).config.to_dict() if config.task == "train" else config.to_dict())
        for override in job:
            key, value = override.split("=", 1)
            got = OmegaConf.select(as_run, key)
            got = got["name"] if isinstance(got, dict) or OmegaConf.is_dict(got) else got
            assert str(got) == value or float(got) == float(value), f"{name}: {override} resolved to {got}"


def test_grids_union_drops_repeats_and_exclusions_and_lets_the_command_line_win():
    params = {"a": "1", "b": "x,y"}
    grids = [{}, {"a": "1,2"}, {"c": "5"}]
    jobs = expand_jobs(params, grids, exclude=[{"a": 2, "b": "y"}])
    assert [sorted(j) for j in jobs] == [["a=1", "b=x"], ["a=1", "b=y"], ["a=2", "b=x"],
                                         ["a=1", "b=x", "c=5"], ["a=1", "b=y", "c=5"]]
    cli = expand_jobs(params, grids, arguments=["a=3"])
    assert [sorted(j) for j in cli] == [["a=3", "b=x"], ["a=3", "b=y"], ["a=3", "b=x", "c=5"], ["a=3", "b=y", "c=5"]]


def test_without_grids_it_is_the_basic_product():
    jobs = expand_jobs({"a": "1,2", "b": "x,y,z"}, arguments=["c=0"])
    assert len(jobs) == 6 and all("c=0" in j for j in jobs)


SIM_SWEEP = ("backend=sim", "num_minibatches=2", "warmup_minibatches=0")


@pytest.fixture
def sweep(tmp_path, monkeypatch, capsys):
    """`python -m odc_bench -m ARGS` in this process, in a scratch folder: (exit status, stdout, stderr)."""
    monkeypatch.chdir(tmp_path)

    def run(*args: str) -> tuple[int, str, str]:
        status = odc_bench("-m", *args)
        out, err = capsys.readouterr()
        return status, out, err

    return run


@pytest.mark.slow
def test_a_sweep_skips_each_combination_that_cannot_run_in_one_line_and_counts_them(tmp_path, sweep):
    status, out, err = sweep("engine=collective,odc", "balancer=lb_mini,lb_micro,dynamic", *SIM_SWEEP,
                             f"results_dir={tmp_path / 'r'}", f"hydra.sweep.dir={tmp_path / 'm'}")
    assert status == 0, err
    skipped = [ln for ln in err.splitlines() if ln.startswith("odc_bench: skipped ")]
    assert [ln.split(":")[1].strip() for ln in skipped] == ["skipped engine=collective balancer=lb_mini",
                                                            "skipped engine=collective balancer=dynamic"]
    assert all("hydra.sweeper.exclude" in ln for ln in skipped)
    assert "odc_bench: sweep of 6 runs: 4 ok, 0 failed, 2 combinations that cannot run (skipped)" in out
    assert len(read_table(tmp_path / "r" / "runs.csv")) == 4
    # The exclusion the message suggests leaves them out without a word.
    status, out, err = sweep(
        "engine=collective,odc", "balancer=lb_mini,lb_micro,dynamic", *SIM_SWEEP,
        "hydra.sweeper.exclude=[{engine:collective,balancer:lb_mini},{engine:collective,balancer:dynamic}]",
        f"results_dir={tmp_path / 'r'}", f"hydra.sweep.dir={tmp_path / 'm2'}")
    assert status == 0 and "odc_bench: skipped" not in err, err
    assert "odc_bench: sweep of 4 runs: 0 ok, 0 failed, 4 already done or under way (skipped)" in out


@pytest.mark.slow
def test_repeats_run_interleaved_unless_asked_back_to_back_and_the_summary_counts_each(tmp_path, sweep):
    status, out, err = sweep("balancer=lb_micro,local_sort", "repeat=2", *SIM_SWEEP, f"results_dir={tmp_path / 'r'}",
                             f"hydra.sweep.dir={tmp_path / 'm'}")
    assert status == 0, err
    assert list(read_table(tmp_path / "r" / "runs.csv")["balancer"]) == ["lb_micro", "local_sort", "local_sort",
                                                                       "lb_micro"], "rounds, the second reversed"
    assert "odc_bench: sweep of 2 configs, 4 runs with their repeats: 4 ok, 0 failed" in out
    _, again, _ = sweep("balancer=lb_micro,local_sort", "repeat=3", *SIM_SWEEP, f"results_dir={tmp_path / 'r'}",
                        f"hydra.sweep.dir={tmp_path / 'm2'}")
    assert ("odc_bench: sweep of 2 configs, 2 runs with their repeats: 2 ok, 0 failed, 4 runs already done or under "
            "way (skipped)") in again, "the third repeat of each config"
    status, apart, err = sweep("balancer=lb_micro,local_sort", "repeat=2", "hydra.sweeper.interleave=false",
                               *SIM_SWEEP, f"results_dir={tmp_path / 'b'}", f"hydra.sweep.dir={tmp_path / 'm3'}")
    assert status == 0, err
    assert list(read_table(tmp_path / "b" / "runs.csv")["balancer"]) == ["lb_micro", "lb_micro", "local_sort",
                                                                       "local_sort"]
    assert "odc_bench: sweep of 2 configs, 4 runs with their repeats: 4 ok, 0 failed" in apart


@pytest.mark.slow
def test_a_sweep_starting_on_a_combination_that_cannot_run_checks_the_next(tmp_path, sweep):
    # The command line's first combination (collective + lb_mini) cannot run; the check takes the next.
    status, out, err = sweep("balancer=lb_mini,lb_micro", *SIM_SWEEP, f"results_dir={tmp_path / 'r'}",
                             f"hydra.sweep.dir={tmp_path / 'm'}")
    assert status == 0 and "1 ok, 0 failed, 1 combination that cannot run" in out, err
    status, _, err = sweep("balancer=lb_mini,dynamic", *SIM_SWEEP, f"results_dir={tmp_path / 'r2'}",
                           f"hydra.sweep.dir={tmp_path / 'm2'}")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert status == 2 and len(lines) == 1, err
    assert lines[0].startswith("odc_bench: error: no combination of the sweep can run, e.g.: balancer lb_mini")
    assert not (tmp_path / "r2").exists() and not (tmp_path / "m2").exists()


def test_bad_input_in_a_later_job_stops_the_sweep_before_any_run(tmp_path, sweep):
    status, _, err = sweep("packing_ratio=1,0.5", *SIM_SWEEP, f"results_dir={tmp_path / 'r'}",
                           f"hydra.sweep.dir={tmp_path / 'm'}")
    assert status == 2 and "packing_ratio=0.5" in err and "packing_ratio must be a number >= 1" in err, err
    assert not (tmp_path / "r" / "runs.csv").exists(), "the first job did not run either"


@pytest.mark.slow
def test_a_sweep_with_a_failed_run_ends_with_a_summary_and_exit_status_1(tmp_path, sweep):
    # A deadline no run meets: the run starts, fails, and is a failed row.
    status, out, err = sweep("minibatch_size=1", "num_minibatches=2", "warmup_minibatches=0", "deadline_s=0.001",
                             f"results_dir={tmp_path / 'r'}", f"hydra.sweep.dir={tmp_path / 'm'}")
    assert status == 1, err
    assert "odc_bench: sweep of 1 run: 0 ok, 1 failed" in out
    assert "odc_bench: failed: minibatch_size=1" in err and "run exceeded its deadline" in err
    assert list(read_table(tmp_path / "r" / "runs.csv")["status"]) == ["failed"]


def _rounds(name: str) -> list[list[dict[str, str]]]:
    """A sweep's jobs as the sweeper runs them: in rounds where a config repeats."""
    jobs = sweep_jobs(sweeper_config(name))
    repeats = [int(dict(o.split("=", 1) for o in job).get("repeat", 1)) for job in jobs]
    return [[dict(o.split("=", 1) for o in job) for job in batch] for batch in interleave(jobs, repeats)]


@pytest.mark.parametrize(("name", "keys"), [("demo", ("engine", "balancer")),
                                            ("ssp_convergence", ("engine", "engine.staleness"))])
def test_a_repeated_sweep_runs_its_series_five_times_in_alternating_order(name, keys):
    rounds = _rounds(name)
    series = [[tuple(j.get(k) for k in keys) for j in batch] for batch in rounds]
    assert len(rounds) == 5 and all(len(set(s)) == 4 == len(s) for s in series)
    for count, batch in enumerate(rounds, 1):  # round r asks every series for r runs
        assert {j["repeat"] for j in batch} == {str(count)}
        assert series[count - 1] == (series[0] if count % 2 else series[0][::-1]), "even rounds in reverse order"


def test_interleaving_leaves_out_configs_of_fewer_repeats_from_later_rounds():
    jobs = [["balancer=a", "repeat=3"], ["balancer=b"], ["balancer=c", "repeat=2"]]
    rounds = interleave(jobs, [3, 1, 2])
    assert rounds == [[["balancer=a", "repeat=1"], ["balancer=b", "repeat=1"], ["balancer=c", "repeat=1"]],
                      [["balancer=c", "repeat=2"], ["balancer=a", "repeat=2"]],
                      [["balancer=a", "repeat=3"]]]


@pytest.mark.parametrize("value,said", [("range(0,0)", "'seed=range(0,0)' gives no values, so the sweep would have "
                                                       "no runs; give it at least one"),
                                        ("interval(0,1)", "'seed=interval(0,1)' is an interval, which a grid sweep "
                                                          "cannot list; give the values (a,b,c) or range(start,stop,"
                                                          "step)")])
def test_a_swept_key_that_lists_no_values_is_refused_in_one_line(value, said, tmp_path, sweep):
    """An empty range ran a sweep of 0 runs (on the command line: 'no combination of the sweep can
    run, e.g.: None'); an interval was Hydra's traceback from a sweep file, its message on the
    command line."""
    from odc_bench.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(said)):
        expand_jobs({"backend": "sim", "seed": value})
    status, _, err = sweep(f"seed={value}", *SIM_SWEEP, f"results_dir={tmp_path / 'r'}",
                           f"hydra.sweep.dir={tmp_path / 'm'}")
    assert (status, err) == (2, f"odc_bench: error: {said}\n")
    assert not (tmp_path / "r").exists() and not (tmp_path / "m").exists()


@pytest.mark.slow
def test_a_glob_over_a_config_groups_options_sweeps_them(tmp_path, sweep):
    """Hydra's glob(...) lists a group's options through its config loader, which the parser the
    sweep and the command line's check made had not: it ended in 'ConfigLoader is not set'."""
    status, out, err = sweep("engine=glob(*)", "balancer=glob(lb_mi*)", *SIM_SWEEP, f"results_dir={tmp_path / 'r'}",
                             f"hydra.sweep.dir={tmp_path / 'm'}")
    assert status == 0, err
    assert "odc_bench: sweep of 4 runs: 3 ok, 0 failed, 1 combination that cannot run (skipped)" in out
    table = read_table(tmp_path / "r" / "runs.csv")
    assert sorted(zip(table["engine"], table["balancer"], strict=True)) == [
        ("collective", "lb_micro"), ("odc", "lb_micro"), ("odc", "lb_mini")]
    status, _, err = sweep("balancer=glob(nothing*)", *SIM_SWEEP, f"results_dir={tmp_path / 'r2'}",
                           f"hydra.sweep.dir={tmp_path / 'm2'}")
    assert (status, err) == (2, "odc_bench: error: 'balancer=glob(nothing*)' gives no values, so the sweep would "
                                "have no runs; give it at least one\n")


@pytest.mark.slow
def test_options_and_sweeps_of_a_users_config_dir_run(tmp_path, sweep):
    """Hydra's --config-dir joins a folder of the user's own options; the check before the run
    composed from the package alone and refused them as unknown."""
    mine = tmp_path / "myconf"
    (mine / "model" / "small").mkdir(parents=True)  # an option in a subfolder: model=small/mytiny
    (mine / "sweep").mkdir()
    tiny = (REPO / "odc_bench" / "conf" / "model" / "tiny.yaml").read_text()
    (mine / "model" / "small" / "mytiny.yaml").write_text(re.sub(r"(?m)^name: .*$", "name: mytiny", tiny))
    (mine / "sweep" / "mine.yaml").write_text("# @package _global_\nhydra:\n  mode: MULTIRUN\n  sweeper:\n"
                                              "    params:\n      model: small/mytiny\n      seed: 0,1\n")
    status, out, err = sweep("-cd", str(mine), "sweep=mine", *SIM_SWEEP, f"results_dir={tmp_path / 'r'}",
                             f"hydra.sweep.dir={tmp_path / 'm'}")
    assert status == 0, err
    assert "odc_bench: sweep of 2 runs: 2 ok, 0 failed" in out
    assert set(read_table(tmp_path / "r" / "runs.csv")["model"]) == {"mytiny"}
    # a primary config of the folder (-cn), on the package's own
    (mine / "mine.yaml").write_text("defaults:\n  - config\n  - _self_\nseed: 7\n")
    status, _, err = sweep("--config-dir", str(mine), "-cn", "mine", *SIM_SWEEP, f"results_dir={tmp_path / 'r2'}",
                           f"hydra.sweep.dir={tmp_path / 'm2'}")
    assert status == 0, err
    assert read_table(tmp_path / "r2" / "runs.csv")["seed"].tolist() == [7]
    status, _, err = sweep("-cd", str(tmp_path / "nothere"), *SIM_SWEEP, f"results_dir={tmp_path / 'r3'}")
    assert (status, err) == (2, f"odc_bench: error: --config-dir {tmp_path / 'nothere'} is not a folder; give the "
                                f"folder of your own configs\n")


@pytest.mark.slow
def test_an_option_of_the_users_named_as_one_of_the_packages_is_refused_as_never_read(tmp_path, sweep):
    """Hydra reads the package's option of a name before a user folder's (--config-dir,
    hydra.searchpath): the user's model/tiny.yaml, edited, ran the stock tiny. A sweep whose later
    job chooses such an option stops before anything is written."""
    mine = tmp_path / "myconf"
    for group, option in (("model", "tiny"), ("backend/hardware", "h100"), ("backend/hardware", "mine")):
        stock = (REPO / "odc_bench" / "conf" / group / f"{option if option != 'mine' else 'h100'}.yaml").read_text()
        (mine / group).mkdir(parents=True, exist_ok=True)
        (mine / group / f"{option}.yaml").write_text(stock.replace("name: h100", f"name: {option}"))
    status, _, err = sweep("-cd", str(mine), "model=tiny", *SIM_SWEEP, f"results_dir={tmp_path / 'r'}")
    assert (status, err) == (2, f"odc_bench: error: {mine / 'model' / 'tiny.yaml'} is never read: Hydra finds the "
                                f"package's model=tiny first; rename yours (and its name: field) and choose it by its "
                                f"new name\n")
    status, _, err = sweep(f"hydra.searchpath=[file://{mine}]", "backend/hardware=mine,h100", "model=qwen2_7b",
                           *SIM_SWEEP,
                           f"results_dir={tmp_path / 'r'}", f"hydra.sweep.dir={tmp_path / 'm'}")
    assert status == 2 and err.endswith(f"{mine / 'backend' / 'hardware' / 'h100.yaml'} is never read: Hydra finds "
                                        f"the package's backend/hardware=h100 first; rename yours (and its name: "
                                        f"field) and choose it by its new name\n"), err
    assert not (tmp_path / "r").exists() and not (tmp_path / "m").exists()
    status, out, _ = sweep(f"hydra.searchpath=[file://{mine}]", "backend/hardware=mine", "model=qwen2_7b", *SIM_SWEEP,
                           f"results_dir={tmp_path / 'r'}", f"hydra.sweep.dir={tmp_path / 'm'}")
    assert status == 0 and "  hardware:\n    name: mine\n" in read_table(tmp_path / "r" / "runs.csv")["config"][0], out
    primary = tmp_path / "primary"
    primary.mkdir()
    (primary / "config.yaml").write_text((REPO / "odc_bench" / "conf" / "config.yaml").read_text() + "seed: 7\n")
    status, _, err = sweep("-cd", str(primary), *SIM_SWEEP, f"results_dir={tmp_path / 'r2'}")
    assert (status, err) == (2, f"odc_bench: error: {primary / 'config.yaml'} is never read: Hydra finds the "
                                f"package's primary config config first; rename yours and choose it with -cn NAME\n")


@pytest.mark.slow
@pytest.mark.parametrize("multirun", [False, True])
def test_relative_paths_are_the_launch_folders_under_hydras_job_chdir(multirun, tmp_path, monkeypatch, capsys):
    """hydra.job.chdir=True (Hydra 1.1's default) ran the job in its output folder, where the
    relative dataset.path the check had found was missing and a relative results_dir went."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lens.jsonl").write_text("".join(f"{n}\n" for n in range(100, 900, 100)))
    status = odc_bench(*(["-m", "seed=0,1"] if multirun else []), "hydra.job.chdir=True", *SIM_SWEEP,
                       "results_dir=rr", "dataset=jsonl", "dataset.path=lens.jsonl")
    assert status == 0, capsys.readouterr().err
    assert len(read_table(tmp_path / "rr" / "runs.csv")) == (2 if multirun else 1)
    assert [p.name for p in tmp_path.rglob("runs.csv")] == ["runs.csv"], "one table, in the launch folder"


@pytest.mark.parametrize("value", ["null", "7"])
def test_a_group_set_to_null_or_a_number_in_a_later_run_stops_the_sweep_before_any_run(tmp_path, sweep, value):
    """Hydra's composition of `model=null` or `model=7` ends in a ValueError: a traceback from the sweeper."""
    status, _, err = sweep(f"model=tiny,{value}", *SIM_SWEEP, f"results_dir={tmp_path / 'r'}",
                           f"hydra.sweep.dir={tmp_path / 'm'}")
    assert status == 2 and err.count("\n") == 1, err
    assert err.startswith(f"odc_bench: error: model={value} ") and f": model={value} names no model option" in err
    assert "; choose one of llama2_7b, " in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("overrides,said,fix", [
    (("seed=range(0,1000000000000000)",), "odc_bench: error: 'seed=range(0,1000000000000000)' makes "
                                          "1,000,000,000,000,000 runs, more than this host can list",
     "sweep fewer values"),
    (("seed=range(0,100000)", "model.num_layers=range(1,100001)"),
     "odc_bench: error: the sweep: every combination of its values makes 10,000,000,000 runs, more than this host "
     "can list", "sweep fewer values"),
    (("seed=1,2", "repeat=1000000000000"), "odc_bench: error: the sweep: its repeats, in rounds, are "
                                           "2,000,000,000,000 runs, more than this host can list",
     "lower repeat, or set hydra.sweeper.interleave=false to run each config's repeats back to back"),
])
def test_a_sweep_of_more_runs_than_this_host_can_list_is_refused_in_one_line(overrides, said, fix, tmp_path, sweep):
    """Before, the command listed them, saying nothing, until the kernel killed it."""
    status, _, err = sweep(*overrides, *SIM_SWEEP, f"results_dir={tmp_path / 'r'}", f"hydra.sweep.dir={tmp_path / 'm'}")
    assert status == 2 and err.startswith(said) and err.endswith(f"; {fix}\n") and err.count("\n") == 1
    assert not (tmp_path / "r").exists() and not (tmp_path / "m").exists()


def test_the_least_a_listed_run_takes_is_no_more_than_a_sweep_of_one_key_takes_per_run():
    """The check refuses what cannot be listed, never what can."""
    tracemalloc.start()
    try:
        expand_jobs({"seed": "range(0,20000)"})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak >= 20000 * SWEEP_JOB_BYTES


@pytest.mark.parametrize("override", ["seed=range(0,10,3)", "x=range(0.0,1.0,0.1)", "x=range(5,0,-1)",
                                      "x=range(0,10,-1)", "x=range(0.5,3)", "x=shuffle(range(0,7))", "x=range(3)"])
def test_a_ranges_length_is_counted_as_hydra_lists_it(override):
    from odc_bench.cli.precheck import _range_length
    from odc_bench.config.compose import overrides_parser

    parsed = overrides_parser().parse_overrides([override])[0]
    assert _range_length(parsed) == len(list(parsed.sweep_string_iterator()))
