import shutil

import pandas as pd
import pytest
import yaml
from rich.console import Console

from odc_bench.errors import PairingError
from odc_bench.record.schema import COLUMNS, SCHEMA_VERSION
from odc_bench.results.__main__ import main as results_main
from odc_bench.results.compare import comparison, print_comparison
from odc_bench.results.pairs import paired_ratios, summarize
from odc_bench.results.series import WORKLOAD_COLUMNS
from odc_bench.results.split import saving as split_of


def _row(run_id, engine, balancer, samples_per_s, status="ok", dataset="longalign", seed=0, group=None):
    workload = dict.fromkeys(WORKLOAD_COLUMNS, 1) | {"backend": "local", "model": "tiny", "dataset": dataset}
    return workload | dict(run_id=run_id, attempt=0, engine=engine, balancer=balancer, seed=seed, status=status,
                           variant=group or "", shard="full", fetch="owner" if engine == "odc" else "", staleness=0,
                           samples_per_s=samples_per_s, bubble_rate=0.1, predicted_bubble_rate=0.05,
                           peak_mem_mb=100.0, cost_model="linear", config=None)


def test_speedups_are_against_collective_lb_micro_with_seeds_averaged():
    table = pd.DataFrame([
        _row("a", "collective", "lb_micro", 10.0, seed=0), _row("b", "collective", "lb_micro", 14.0, seed=1),
        _row("c", "odc", "lb_mini", 18.0), _row("d", "collective", "local_sort", 6.0),
        _row("e", "odc", "lb_mini", 99.0, status="failed"),
    ])
    rows = comparison(table).set_index(["engine", "balancer"])
    assert rows.loc[("collective", "lb_micro"), "runs"] == 2
    assert rows.loc[("odc", "lb_mini"), "speedup"] == pytest.approx(18.0 / 12.0)
    assert rows.loc[("collective", "local_sort"), "speedup"] == pytest.approx(0.5)
    edited = pd.concat([table, pd.DataFrame([_row("f", "odc", "lb_mini", float("nan"))])], ignore_index=True)
    assert comparison(edited).set_index(["engine", "balancer"]).loc[("odc", "lb_mini"), "runs"] == 1, \
        "an ok row whose throughput a hand edit left out is no run"


def test_without_lb_micro_the_baseline_is_collective_local_sort_per_workload():
    table = pd.DataFrame([
        _row("a", "collective", "local_sort", 5.0, dataset="aime"), _row("b", "odc", "local_sort", 7.5, dataset="aime"),
        _row("c", "odc", "dynamic", 3.0, dataset="fixed"),
    ])
    rows = comparison(table)
    aime = rows[rows.dataset == "aime"].set_index("engine")
    assert aime.loc["odc", "speedup"] == pytest.approx(1.5)
    assert rows[rows.dataset == "fixed"]["speedup"].isna().all(), "no collective run: nothing to compare with"
    console = Console(record=True, width=120)
    print_comparison(rows, console)
    text = console.export_text()
    assert "odc+local_sort" in text and "1.50x" in text and "speedup vs collective+local_sort" in text


def test_fsdp2_on_two_process_groups_is_two_series_and_the_shared_memory_one_is_the_baseline():
    table = pd.DataFrame([
        _row("a", "collective", "local_sort", 5.0, group="gloo"),
        _row("b", "collective", "local_sort", 8.0, group="shm"),
        _row("c", "odc", "local_sort", 10.0),
    ])
    rows = comparison(table).set_index("series")
    assert rows.loc["collective[shm]+local_sort", "speedup"] == pytest.approx(1.0)
    assert rows.loc["collective[gloo]+local_sort", "speedup"] == pytest.approx(5.0 / 8.0)
    assert rows.loc["odc+local_sort", "speedup"] == pytest.approx(10.0 / 8.0)
    console = Console(record=True, width=120)
    print_comparison(comparison(table), console)
    assert "collective[gloo]+local_sort" in console.export_text(), "the group is printed, not eaten as markup"


def test_runs_with_and_without_activation_checkpointing_are_compared_apart():
    """They computed different work: before, a run with it and one without were two runs of one
    series, their median a mixture of both."""
    on = "backend:\n  name: local\n  recompute: true\n  recompute_mode: blocks\n  recompute_blocks: 0.25\n"
    off = "backend:\n  name: local\n  recompute: false\n  recompute_mode: full\n"
    table = pd.DataFrame([
        _row("a", "collective", "local_sort", 10.0), _row("b", "odc", "local_sort", 15.0) | {"config": off},
        _row("c", "collective", "local_sort", 4.0) | {"config": on},
        _row("d", "odc", "local_sort", 5.0) | {"config": on},
    ])
    rows = comparison(table)
    assert sorted(rows["checkpointing"]) == ["", "", "blocks 0.25", "blocks 0.25"]
    assert (rows["runs"] == 1).all()
    assert sorted(rows.loc[rows.engine == "odc", "speedup"]) == pytest.approx([1.25, 1.5])
    console = Console(record=True, width=160)
    print_comparison(rows, console)
    text = " ".join(console.export_text().split())  # titles wrap
    assert "minibatch 1/rank (local, activation checkpointing blocks 0.25); speedup vs collective+local_sort" in text
    assert "minibatch 1/rank (local); speedup vs collective+local_sort" in text
    cut = table.assign(config=table["config"].where(table["config"].isna(), "backend: {name: local, recompute"))
    assert set(comparison(cut)["checkpointing"]) == {""}, "a config cell cut short is read as without it"


def test_a_title_names_the_workload_columns_its_tables_differ_in():
    """Runs in fp32 and in bf16 are two tables: before, their titles were the same."""
    table = pd.DataFrame([_row("a", "odc", "local_sort", 1.0) | {"precision": "fp32"},
                          _row("b", "odc", "local_sort", 2.0) | {"precision": "bf16"}])
    console = Console(record=True, width=200)
    print_comparison(comparison(table), console)
    text = console.export_text()
    assert "minibatch 1/rank (local, precision=bf16)" in text and "minibatch 1/rank (local, precision=fp32)" in text


def test_one_process_group_is_not_named():
    table = pd.DataFrame([_row("a", "collective", "local_sort", 5.0, group="shm"), _row("b", "odc", "local_sort", 6.0)])
    assert set(comparison(table)["series"]) == {"collective+local_sort", "odc+local_sort"}


def _pair_rows(prefix, ratios, baseline=10.0):
    """odc and collective runs of seeds 0.. whose odc / collective ratios are `ratios`."""
    return pd.DataFrame([r for seed, ratio in enumerate(ratios) for r in (
        _row(f"{prefix}c{seed}", "collective", "local_sort", baseline + seed, seed=seed),
        _row(f"{prefix}o{seed}", "odc", "local_sort", (baseline + seed) * ratio, seed=seed))])


def test_pairs_are_the_same_seed_in_the_same_results_folder_never_across_folders():
    only_odc = _pair_rows("x", [1.0, 1.0])
    tables = {"a": _pair_rows("a", [1.1, 0.9], baseline=10.0), "b": _pair_rows("b", [1.0, 1.2], baseline=50.0),
              "c": only_odc[only_odc.engine == "odc"]}
    pairs = paired_ratios(tables, "odc", "collective").set_index(["run", "seed"])
    assert sorted(pairs.index) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)], "folder c has no collective run to pair"
    assert pairs["ratio"].to_dict() == pytest.approx({("a", 0): 1.1, ("a", 1): 0.9, ("b", 0): 1.0, ("b", 1): 1.2})
    assert pairs.loc[("b", 1), "baseline_samples_per_s"] == pytest.approx(51.0)


def test_the_summary_is_the_median_pair_with_an_interval_that_spans_disagreeing_folders():
    pairs = paired_ratios({"a": _pair_rows("a", [1.0, 1.0, 1.0]), "b": _pair_rows("b", [1.2, 1.2, 1.2])},
                          "odc", "collective")
    s = summarize(pairs)
    assert s["median"] == pytest.approx(1.1)
    assert (s["pairs"], s["runs"], s["slower"]) == (6, 2, 0)
    assert (s["low"], s["high"]) == pytest.approx((1.0, 1.2)), "either folder alone may be the whole resample"
    agreeing = summarize(paired_ratios({"a": _pair_rows("a", [0.9, 0.9]), "b": _pair_rows("b", [0.9, 0.9])},
                                       "odc", "collective"))
    assert (agreeing["low"], agreeing["median"], agreeing["high"], agreeing["slower"]) == pytest.approx(
        (0.9, 0.9, 0.9, 4))


def test_fsdp2_on_two_process_groups_must_be_named_to_be_paired():
    table = pd.DataFrame([_row("g", "collective", "local_sort", 5.0, group="gloo"),
                          _row("s", "collective", "local_sort", 8.0, group="shm"),
                          _row("o", "odc", "local_sort", 10.0)])
    with pytest.raises(PairingError, match=r"2 collective runs of the same .*name one of collective\[gloo\], "
                                           r"collective\[shm\]"):
        paired_ratios({"fair": table}, "odc", "collective")
    twice = pd.concat([table, pd.DataFrame([_row("o2", "odc", "local_sort", 11.0)])], ignore_index=True)
    with pytest.raises(PairingError, match="2 odc runs of the same .*one such run per seed"):
        paired_ratios({"prefetch": twice}, "odc", "collective[shm]")
    pairs = paired_ratios({"fair": table}, "odc", "collective[shm]")
    assert pairs["ratio"].tolist() == pytest.approx([10.0 / 8.0])


def test_pairs_command_prints_each_pair_and_refuses_folders_without_pairs_in_one_line(tmp_path, capsys):
    for name, ratios in (("a", [1.1, 0.9, 1.0]), ("b", [1.05])):
        (tmp_path / name).mkdir()
        table = _pair_rows(name, ratios).assign(schema_version=SCHEMA_VERSION).reindex(columns=COLUMNS)
        table.to_csv(tmp_path / name / "runs.csv", index=False)
    assert results_main(["pairs", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "median 1.000 over 3 pairs" in out and "median 1.025 over 4 pairs in 2 results folders" in out
    assert "odc the slower in 1 of 4 pairs" in out
    # A copy of a folder beside it: its pairs are the same ones, not more of them.
    shutil.copytree(tmp_path / "a", tmp_path / "a-backup")
    assert results_main(["pairs", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "median 1.025 over 4 pairs in 2 results folders" in captured.out
    assert "3 row(s) of " not in captured.err and "6 row(s) of " in captured.err and "(a copy)" in captured.err
    for option, series in (("--engine", "odc_lockstep"), ("--baseline", ""), ("--baseline", "collective[nccl]")):
        # A series no folder holds (a typo, an empty name) was "no workload and seed ran as both".
        assert results_main(["pairs", str(tmp_path / "a"), option, series]) == 2
        err = capsys.readouterr().err.strip()
        assert err == (f"python -m odc_bench.results: error: no ok run of these folders is of series {series!r}; "
                       f"they hold collective, odc")
    odc_only, collective_only = tmp_path / "o", tmp_path / "c"
    for folder, engine in ((odc_only, "odc"), (collective_only, "collective")):
        folder.mkdir()
        rows = pd.read_csv(tmp_path / "a" / "runs.csv")
        rows[rows.engine == engine].to_csv(folder / "runs.csv", index=False)
    assert results_main(["pairs", str(odc_only), str(collective_only)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("python -m odc_bench.results: error: no workload and seed ran as both odc and collective in "
                          "one results folder")
    assert "\n" not in err


def test_the_comparison_ends_with_four_lines_on_its_columns_and_the_runs_spread():
    once = comparison(pd.DataFrame([_row("a", "collective", "lb_micro", 10.0), _row("c", "odc", "lb_mini", 12.0)]))
    console = Console(record=True, width=400)
    print_comparison(once, console)
    last = console.export_text().strip().splitlines()[-4:]
    assert last[0].startswith("samples/s: ") and "speedup: " in last[0]
    assert last[1].startswith("bubble: ") and "predicted: " in last[1]
    assert last[2].startswith("compute: ") and "not work one engine skips" in last[2]
    assert "ran once" in last[3] and "repeat=5" in last[3]
    twice = comparison(pd.DataFrame([_row("a", "collective", "lb_micro", 9.0),
                                     _row("b", "collective", "lb_micro", 11.0), _row("c", "odc", "lb_mini", 12.0)]))
    console = Console(record=True, width=400)
    print_comparison(twice, console)
    spread = console.export_text().strip().splitlines()[-1]
    assert spread.startswith("Runs of one series here span up to 20% of their median") and "repeat=N" in spread


def _timed(run_id, engine, balancer, per, idle, compute, optimizer):
    """A run taking `per` seconds a sample: idle + compute + optimizer (seconds a sample, adding up to it)."""
    assert idle + compute + optimizer == pytest.approx(per)
    return _row(run_id, engine, balancer, 1 / per) | dict(bubble_rate=idle / per, compute_s=compute / per * 10.0,
                                                          wall_s=10.0)


def _printed(rows) -> str:
    console = Console(record=True, width=400)
    print_comparison(rows, console)
    return console.export_text()


def test_a_speedup_splits_into_idle_optimizer_and_compute_shares_that_add_up():
    # Baseline: 1 s per sample = 0.4 idle + 0.5 compute + 0.1 optimizer. Series: 0.8 s = 0.25 idle +
    # 0.5 compute + 0.05 optimizer. Saved 0.2 s: 75% idle, 25% optimizer, none from compute.
    rows = comparison(pd.DataFrame([_timed("a", "collective", "lb_micro", 1.0, 0.4, 0.5, 0.1),
                                    _timed("b", "odc", "lb_mini", 0.8, 0.25, 0.5, 0.05)])).set_index("engine")
    assert rows.loc["odc", "speedup"] == pytest.approx(1.25)
    assert rows.loc["odc", "saved"] == "idle 75%, optimizer step 25%"
    assert "idle 75%, optimizer step 25%" in _printed(rows.reset_index())
    slower = split_of(pd.Series({"idle": 0.5, "compute": 0.5, "optimizer": 0.1}),
                      pd.Series({"idle": 0.4, "compute": 0.5, "optimizer": 0.1}))
    assert slower is None, "nothing saved: no split"


def test_a_part_that_grew_is_said_to_take_back_a_share_of_what_the_others_saved():
    # The demo's 825%/17%/-742% as shares of the net saving: idle saved 0.5 s, the optimizer 0.01 s, compute
    # grew by 0.45 s. Shares of the gross saving instead: each in 0-100%, adding up to 100%.
    split = split_of(pd.Series({"idle": 0.5, "compute": 1.45, "optimizer": 0.09}),
                     pd.Series({"idle": 1.0, "compute": 1.0, "optimizer": 0.1}))
    assert split is not None and sum(split.shares.values()) == pytest.approx(1.0)
    assert all(0 <= v <= 1 for v in [*split.shares.values(), *split.took_back.values()])
    assert split.describe() == "idle 98%, optimizer step 2%; compute grew, taking back 88%"


def test_the_split_is_given_only_where_the_speedups_range_excludes_1():
    base = [_timed("a", "collective", "lb_micro", 1.0, 0.4, 0.5, 0.1),
            _timed("b", "collective", "lb_micro", 1.1, 0.5, 0.5, 0.1)]
    # ODC's runs at 0.9 and 1.4 s a sample: a speedup range of 0.71-1.22x.
    noisy = comparison(pd.DataFrame([*base, _timed("c", "odc", "lb_mini", 0.9, 0.3, 0.5, 0.1),
                                     _timed("d", "odc", "lb_mini", 1.4, 0.8, 0.5, 0.1)])).set_index("engine")
    assert noisy.loc["odc", "speedup_low"] < 1 < noisy.loc["odc", "speedup_high"]
    assert noisy.loc["odc", "saved"] == "within noise"
    clear = comparison(pd.DataFrame([*base, _timed("c", "odc", "lb_mini", 0.8, 0.2, 0.5, 0.1),
                                     _timed("d", "odc", "lb_mini", 0.85, 0.25, 0.5, 0.1)])).set_index("engine")
    assert clear.loc["odc", "speedup_low"] > 1 and clear.loc["odc", "saved"] == "idle 100%"
    text = _printed(noisy.reset_index()).replace("\n", " ")
    assert "within noise" in text
    assert "compute: the units' forward and backward seconds. Both engines run the same model" in text


def _config(hardware="h100", engine="odc", prefetch=True, compile_=None, hidden=128, nic=400):
    """A row's config text with the keys these tests vary (the rest as a run records them)."""
    values = {"world_size": 2, "seed": 0, "results_dir": "results/x", "model": {"name": "tiny", "hidden_size": hidden},
              "engine": {"name": engine, **({"prefetch": prefetch, "staleness": 0} if engine == "odc" else
                                            {"backend": "shm"})},
              "balancer": {"name": "local_sort", "cost_model": "quadratic"},
              "backend": {"name": "sim", "hardware": {"name": hardware, "nic_gbps": nic}}}
    if compile_ is not None:
        values["compile"] = compile_
    return yaml.safe_dump(values, sort_keys=False)


def test_runs_of_one_named_workload_that_their_configs_tell_apart_are_compared_apart():
    """Runs simulated on two hardware profiles (or with another NIC, a model reshaped under its
    name, compile on and off) are different workloads: before, they were repeats of one series,
    their median a mixture."""
    table = pd.DataFrame([
        _row("a", "collective", "local_sort", 10.0) | {"config": _config("h100", "collective")},
        _row("b", "odc", "local_sort", 15.0) | {"config": _config("h100")},
        _row("c", "collective", "local_sort", 4.0) | {"config": _config("a100", "collective")},
        _row("d", "odc", "local_sort", 5.0) | {"config": _config("a100")},
        _row("e", "collective", "local_sort", 2.0) | {"config": _config("a100", "collective", nic=100)},
        _row("f", "odc", "local_sort", 3.0) | {"config": _config("a100", nic=100)},
    ])
    rows = comparison(table)
    assert (rows["runs"] == 1).all()
    assert sorted(set(rows["overrides"])) == ["backend/hardware=a100, backend.hardware.nic_gbps=100",
                                              "backend/hardware=a100, backend.hardware.nic_gbps=400",
                                              "backend/hardware=h100"]
    assert sorted(rows.loc[rows.engine == "odc", "speedup"]) == pytest.approx([1.25, 1.5, 1.5])
    console = Console(record=True, width=200)
    print_comparison(rows, console)
    text = " ".join(console.export_text().split())
    assert "minibatch 1/rank (local, backend/hardware=h100); speedup vs collective+local_sort" in text
    # a model's shape under one name, and compile set against left unset (its record leaves it out)
    real = pd.DataFrame([
        _row("g", "odc", "local_sort", 1.0) | {"config": _config(hidden=128)},
        _row("h", "odc", "local_sort", 2.0) | {"config": _config(hidden=96)},
        _row("i", "odc", "local_sort", 3.0) | {"config": _config(hidden=96, compile_=False)},
    ])
    assert sorted(comparison(real)["overrides"]) == ["compile=false, model.hidden_size=96",
                                                     "compile=null, model.hidden_size=128",
                                                     "compile=null, model.hidden_size=96"]
    # a row from before a key existed is the same workload as one that holds it
    older = _config().replace("  nic_gbps: 400\n", "")
    assert "nic_gbps" not in older
    drift = pd.DataFrame([_row("j", "odc", "local_sort", 1.0) | {"config": older},
                          _row("k", "odc", "local_sort", 3.0) | {"config": _config()}])
    assert comparison(drift)[["overrides", "runs"]].values.tolist() == [["", 2]]
    # nor, for a simulated run, the real ranks' threads, compile and device, which it does not use
    sim = [yaml.safe_load(_config()) | extra for extra in ({}, {"threads_per_rank": 1, "compile": True})]
    simulated = pd.DataFrame([_row(f"s{i}", "odc", "local_sort", 1.0) | {"config": yaml.safe_dump(c), "backend": "sim"}
                              for i, c in enumerate(sim)])
    assert comparison(simulated)[["overrides", "runs"]].values.tolist() == [["", 2]]
    # nor do where its results and lengths caches went, or its seed (repeats)
    moved = yaml.safe_load(_config()) | {"results_dir": "elsewhere", "seed": 3, "dataset": {"cache_dir": "/tmp/c"}}
    drift.loc[1, "config"] = yaml.safe_dump(moved)
    assert comparison(drift)[["overrides", "runs"]].values.tolist() == [["", 2]]


def test_engine_options_that_differ_between_runs_are_series_of_their_own():
    """ODC with and without prefetch beside one baseline: two series, each against it; before,
    one series of two runs."""
    table = pd.DataFrame([
        _row("a", "collective", "local_sort", 10.0) | {"config": _config(engine="collective")},
        _row("b", "odc", "local_sort", 15.0) | {"config": _config(prefetch=True)},
        _row("c", "odc", "local_sort", 12.0) | {"config": _config(prefetch=False)},
    ])
    rows = comparison(table).set_index("series")
    assert rows.loc["odc[prefetch=true]+local_sort", "speedup"] == pytest.approx(1.5)
    assert rows.loc["odc[prefetch=false]+local_sort", "speedup"] == pytest.approx(1.2)
    assert rows.loc["collective+local_sort", "runs"] == 1
    with pytest.raises(PairingError, match=r"name one of odc\[prefetch=false\], odc\[prefetch=true\]"):
        paired_ratios({"prefetch": table}, "odc", "collective")
    pairs = paired_ratios({"prefetch": table}, "odc[prefetch=false]", "collective")
    assert pairs["ratio"].tolist() == pytest.approx([1.2])
    # hybrid sharding over emulated nodes of 2 and of 4 ranks
    hybrid = [yaml.safe_load(_config()) for _ in range(2)]
    for config, per_node in zip(hybrid, (2, 4), strict=True):
        config["engine"].update(shard="hybrid", ranks_per_node=per_node)
    table = pd.DataFrame([_row(f"h{i}", "odc", "local_sort", 10.0 + i) | {"config": yaml.safe_dump(c),
                                                                           "shard": "hybrid"}
                          for i, c in enumerate(hybrid)])
    assert sorted(comparison(table)["series"]) == ["odc[ranks_per_node=2]+local_sort",
                                                   "odc[ranks_per_node=4]+local_sort"]


def test_a_balancer_under_two_cost_models_is_two_series():
    table = pd.DataFrame([_row("a", "collective", "lb_micro", 10.0),
                          _row("b", "odc", "lb_mini", 12.0) | {"cost_model": "linear"},
                          _row("c", "odc", "lb_mini", 14.0) | {"cost_model": "calibrated:tiny-cpu"}])
    rows = comparison(table).set_index("series")
    assert rows.loc["odc+lb_mini (linear)", "speedup"] == pytest.approx(1.2)
    assert rows.loc["odc+lb_mini (calibrated:tiny-cpu)", "speedup"] == pytest.approx(1.4)


def test_a_table_with_text_in_a_column_of_numbers_is_refused_in_one_line_and_the_figures_leave_it_out(tmp_path,
                                                                                                      capsys):
    """Before, compare and pairs ended in a TypeError traceback (str / float) and the figures drew the rest."""
    from paper_figures.inputs import read_runs

    (tmp_path / "r").mkdir()
    rows = [_row("a", "collective", "lb_micro", 10.0), _row("b", "odc", "lb_mini", "fast")]
    pd.DataFrame(rows).assign(schema_version=SCHEMA_VERSION).reindex(columns=COLUMNS).to_csv(
        tmp_path / "r" / "runs.csv", index=False)
    for command in ("compare", "pairs"):
        assert results_main([command, str(tmp_path / "r")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.endswith("runs.csv: the row of run b holds 'fast' in column samples_per_s, which holds numbers; "
                            "correct or remove that row, or move it away or set results_dir to another folder")
        assert "\n" not in err
    notes: list[str] = []
    assert read_runs(tmp_path, notes).empty
    assert notes == [f"{tmp_path / 'r' / 'runs.csv'} left out: the row of run b holds 'fast' in column samples_per_s, "
                     f"which holds numbers"]
