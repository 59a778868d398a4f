import multiprocessing
from pathlib import Path

import pandas as pd
import pytest

from odc_bench.plan.identity import run_key
from odc_bench.record.schema import COLUMNS, SCHEMA_VERSION
from odc_bench.results.table import append_row, ok_runs, read_table


def _append_many(path, start):
    for i in range(start, start + 25):
        append_row(path, {"run_id": f"r{i}", "status": "ok", "samples_per_s": float(i)})


@pytest.mark.slow
def test_concurrent_appends_lose_no_row(tmp_path):
    path = tmp_path / "runs.csv"
    procs = [multiprocessing.get_context("spawn").Process(target=_append_many, args=(path, s)) for s in (0, 100)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    table = pd.read_csv(path)
    assert list(table.columns) == COLUMNS
    assert sorted(table["run_id"]) == sorted([f"r{i}" for i in range(25)] + [f"r{i}" for i in range(100, 125)])
    assert not list(tmp_path.glob(".*.tmp")), "no temporary file may be left behind"


def test_rows_outside_the_schema_are_refused(tmp_path):
    with pytest.raises(ValueError, match="outside the schema"):
        append_row(tmp_path / "runs.csv", {"run_id": "x", "surprise": 1})


def test_ok_runs_counts_successful_rows_and_attempts_count_every_row(tmp_path):
    path = tmp_path / "runs.csv"
    attempts = [append_row(path, {"run_id": run, "status": status})
                for run, status in (("good", "ok"), ("bad", "failed"), ("good", "ok"), ("bad", "ok"))]
    assert attempts == [0, 0, 1, 1]
    assert ok_runs(path) == {"good": 2, "bad": 1}
    assert list(read_table(path)["attempt"]) == [0, 0, 1, 1]


def test_run_key_ignores_results_dir_repeat_and_key_order():
    a = run_key({"world_size": 2, "model": {"name": "tiny"}, "results_dir": "x", "repeat": 1})
    b = run_key({"model": {"name": "tiny"}, "world_size": 2, "results_dir": "y", "repeat": 3})
    assert a == b
    assert a != run_key({"model": {"name": "tiny"}, "world_size": 4})


def test_hex_ids_that_look_like_numbers_survive_appends(tmp_path):
    from odc_bench.record.schema import COLUMNS
    from odc_bench.results.table import append_row, read_table

    path = tmp_path / "runs.csv"
    for run_id in ("0123456789abcdef", "1234567890123456"):
        append_row(path, {**{c: None for c in COLUMNS}, "run_id": run_id, "schema_version": SCHEMA_VERSION,
                          "status": "ok",
                          "commit": "310e538"})
    table = read_table(path)
    assert list(table["commit"]) == ["310e538", "310e538"]
    assert list(table["run_id"]) == ["0123456789abcdef", "1234567890123456"]


# Text of every text column that pandas would take for a number: digits with a leading zero, an
# exponent, an integer, a hostname of digits.
NUMBER_LIKE = {"model": "0007", "host": "10", "dataset": "1e3", "error": "137", "variant": "2"}


def test_text_that_looks_like_a_number_stays_text_through_appends_collect_and_the_figures(tmp_path):
    from odc_bench.results.collect import collect
    from paper_figures.inputs import read_runs

    ours, theirs = tmp_path / "ours" / "runs.csv", tmp_path / "theirs" / "runs.csv"
    for run_id in ("a", "b"):  # the second append reads the first row back and writes it again
        append_row(ours, {"run_id": run_id, "schema_version": SCHEMA_VERSION, "status": "ok", "engine": "odc",
                          **NUMBER_LIKE})
    append_row(theirs, {"run_id": "c", "schema_version": SCHEMA_VERSION, "status": "ok", "model": "tiny",
                        "host": "vm", "dataset": "longalign", "error": "rank 1 died", "variant": "", "engine": "odc"})
    table = read_table(ours)
    for column, text in NUMBER_LIKE.items():
        assert list(table[column]) == [text, text], column
    rows = collect([tmp_path], tmp_path / "all.csv")  # 0007 beside tiny: a column of text, not of both
    assert sorted(rows["model"]) == ["0007", "0007", "tiny"]
    assert sorted(pd.read_parquet(tmp_path / "all.parquet")["model"]) == ["0007", "0007", "tiny"]
    assert sorted(read_runs(tmp_path / "ours", [])["model"]) == ["0007", "0007"]


# Text that pandas takes for a missing value wherever it stands: a model, dataset or host so named.
MISSING_LIKE = {"model": "NA", "host": "null", "dataset": "None", "error": "N/A", "variant": "nan"}


def test_text_that_pandas_takes_for_missing_stays_text_through_appends_collect_figures_and_migration(tmp_path):
    """A model named NA read back as missing: the next append wrote the row's model empty."""
    from odc_bench.results.collect import collect
    from odc_bench.results.migrate import migrate_table
    from paper_figures.inputs import read_runs

    path = tmp_path / "ours" / "runs.csv"
    for run_id in ("a", "b"):  # the second append reads the first row back and writes it again
        append_row(path, {"run_id": run_id, "schema_version": SCHEMA_VERSION, "status": "ok", "engine": "odc",
                          "samples_per_s": 1.5, **MISSING_LIKE})
    table = read_table(path)
    for column, text in MISSING_LIKE.items():
        assert list(table[column]) == [text, text], column
    assert table["balancer"].isna().all() and table["loss_last"].isna().all()  # empty cells are still missing
    assert sorted(collect([tmp_path / "ours"], tmp_path / "all.csv")["model"]) == ["NA", "NA"]
    assert sorted(read_runs(tmp_path / "ours", [])["model"]) == ["NA", "NA"]
    table.loc[:, "schema_version"] = SCHEMA_VERSION - 1  # any earlier schema: migrate rewrites the table
    table.drop(columns=["resumed_from", "requeues"]).to_csv(path, index=False)
    migrate_table(path)
    assert list(read_table(path)["model"]) == ["NA", "NA"]


def test_migrate_refuses_a_column_added_by_hand_and_writes_nothing(tmp_path):
    """A column no schema holds (notes a user added in a spreadsheet): the rewrite to this schema's
    columns dropped it without a word."""
    from odc_bench.errors import TableError
    from odc_bench.results.migrate import migrate_table

    path = tmp_path / "runs.csv"
    append_row(path, {"run_id": "a", "schema_version": SCHEMA_VERSION, "status": "ok", "engine": "odc"})
    table = read_table(path).assign(schema_version=SCHEMA_VERSION - 1, notes="keep me")
    table.to_csv(path, index=False)
    before = path.read_bytes()
    with pytest.raises(TableError, match=r"runs\.csv has the column\(s\) notes, which no schema of the results "
                                         r"table holds: migrating would drop them; keep them in a file of your "
                                         r"own, remove them from the table, then migrate it$"):
        migrate_table(path)
    assert path.read_bytes() == before


def test_a_table_of_its_own_schema_is_written_back_as_it_was_read(tmp_path):
    from odc_bench.results.table import append_rows

    path, columns = tmp_path / "primitives.csv", ["run_id", "commit", "host", "seconds"]
    first = {"run_id": "1e23456789012345", "commit": "0123456", "host": "007", "seconds": 0.1}
    append_rows(path, [first], columns)
    append_rows(path, [{**first, "run_id": "abc", "seconds": 0.25}], columns)
    assert path.read_text(encoding="utf-8").splitlines() == [
        "run_id,commit,host,seconds", "1e23456789012345,0123456,007,0.1", "abc,0123456,007,0.25"]


def test_a_schema_2_table_is_refused_with_the_migration_and_migrates_to_zero_resumes(tmp_path):
    from odc_bench.errors import TableError
    from odc_bench.results.migrate import migrate_table
    from odc_bench.results.table import check_table

    old = [c for c in COLUMNS if c not in ("resumed_from", "requeues")]
    path = tmp_path / "runs.csv"
    rows = [{**{c: "" for c in old}, "run_id": run_id, "schema_version": 2, "status": "ok", "samples_per_s": rate}
            for run_id, rate in (("a", 1.5), ("b", 2.25))]
    pd.DataFrame(rows, columns=old).to_csv(path, index=False)
    with pytest.raises(TableError, match=f"schema 2, this code writes {SCHEMA_VERSION}.*results migrate"):
        check_table(path)
    assert migrate_table(path) == 2
    table = pd.read_csv(path)
    assert list(table.columns) == COLUMNS
    assert list(table["schema_version"]) == [SCHEMA_VERSION] * 2
    assert list(table["resumed_from"]) == [0, 0] and list(table["requeues"]) == [0, 0]
    assert list(table["samples_per_s"]) == [1.5, 2.25] and list(table["run_id"]) == ["a", "b"]
    assert migrate_table(path) == 0  # already this schema


def test_migrate_gives_a_row_of_real_data_its_key_where_its_data_is_unchanged(tmp_path):
    """A run of real data is keyed by the samples it draws too, and no run by its timeout_s
    (plan/identity.py): a row keyed before that gets its config's key now while its data is the
    same; a row whose data changed since keeps its own, so a re-run sweep measures that run again."""
    from odc_bench.plan.spec import resolve
    from odc_bench.record.row import base_row
    from odc_bench.results.migrate import migrate_table
    from tests.helpers import run_config
    from tests.helpers.real_data import write_jsonl

    def row(run_id: str, *overrides: str) -> tuple[dict, str]:
        spec = resolve(run_config("backend=sim", "minibatch_size=2", "num_minibatches=3", *overrides))
        return {**{c: "" for c in COLUMNS}, **base_row(spec), "status": "ok", "run_id": run_id}, spec.run_id

    def real(data: Path) -> tuple[str, ...]:
        written = write_jsonl(data, [300 + 40 * i for i in range(64)])
        return "dataset=jsonl", f"dataset.path={written}", "max_tokens=4096"

    kept, key = row("0ld0000000000000", *real(tmp_path / "kept.jsonl"))
    changed, _ = row("0ld1111111111111", *real(tmp_path / "changed.jsonl"))
    write_jsonl(tmp_path / "changed.jsonl", [300 + 20 * i for i in range(64)])
    waited, waited_key = row("0ld2222222222222", "timeout_s=600")
    path = tmp_path / "runs.csv"
    pd.DataFrame([kept, changed, waited], columns=COLUMNS).to_csv(path, index=False)
    assert migrate_table(path) == 3
    assert list(pd.read_csv(path, dtype=str)["run_id"]) == [key, "0ld1111111111111", waited_key]
    assert migrate_table(path) == 0


def test_the_migration_a_refusal_names_migrates_the_table_whatever_its_name(tmp_path, capsys):
    """A merged table (`results collect --out`) may have any name: the command the refusal gives
    migrates it, and a migration that finds no table says so in one line."""
    import re

    from odc_bench.errors import TableError
    from odc_bench.results.__main__ import main
    from odc_bench.results.table import check_table

    old = [c for c in COLUMNS if c not in ("resumed_from", "requeues")]
    path = tmp_path / "merged" / "collected.csv"
    path.parent.mkdir()
    pd.DataFrame([{**{c: "" for c in old}, "run_id": "a", "schema_version": 2, "status": "ok"}],
                 columns=old).to_csv(path, index=False)
    with pytest.raises(TableError) as refused:
        check_table(path)
    command = re.search(r"`python -m odc_bench\.results (migrate \S+)`", str(refused.value))
    assert command is not None, refused.value
    assert main(command.group(1).split()) == 0
    assert capsys.readouterr().out == f"{path.resolve()}: 1 rows migrated\n"
    check_table(path)  # this schema now
    (tmp_path / "empty").mkdir()
    assert main(["migrate", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m odc_bench.results: error: no runs.csv under {tmp_path / 'empty'}")
    assert err.count("\n") == 1


def test_a_schema_4_table_is_keyed_by_whole_configs_where_each_row_draws_its_lengths_again(tmp_path):
    from odc_bench.plan.spec import resolve
    from odc_bench.record.row import sim_row
    from odc_bench.results.migrate import migrate_table
    from odc_bench.sim import simulate
    from tests.helpers import run_config

    spec = resolve(run_config("backend=sim", "num_minibatches=2", "warmup_minibatches=0"))
    row = {**sim_row(spec, simulate(spec, trace=False), ""), "schema_version": 4}
    rows = [{**row, "run_id": "keyed-before"},
            {**row, "run_id": "other-lengths", "len_mean": row["len_mean"] + 1},  # an earlier profile drew these
            {**row, "run_id": "no-plan", "config": "engine:\n  name: retired"},
            {**row, "run_id": "keyed-before"}]
    path = tmp_path / "runs.csv"
    pd.DataFrame(rows, columns=COLUMNS).to_csv(path, index=False)
    assert migrate_table(path) == 4
    table = read_table(path)
    assert list(table["run_id"]) == [spec.run_id, "other-lengths", "no-plan", spec.run_id]
    assert list(table["attempt"]) == [0, 0, 0, 1] and (table["schema_version"] == SCHEMA_VERSION).all()
    assert migrate_table(path) == 0


def test_a_schema_5_table_gets_the_attention_kernel_its_real_runs_ran_and_keeps_its_keys(tmp_path):
    from odc_bench.results.migrate import migrate_table

    old = [c for c in COLUMNS if c != "attention"]
    rows = [{**{c: "" for c in old}, "run_id": run_id, "schema_version": 5, "status": "ok", "backend": backend}
            for run_id, backend in (("a", "local"), ("b", "sim"))]
    path = tmp_path / "runs.csv"
    pd.DataFrame(rows, columns=old).to_csv(path, index=False)
    assert migrate_table(path) == 2
    table = read_table(path)
    assert list(table.columns) == COLUMNS and list(table["run_id"]) == ["a", "b"]
    assert list(table["attention"].fillna("")) == ["sdpa_per_doc", ""]


def test_compile_left_at_null_keeps_the_key_and_a_choice_makes_its_own():
    from odc_bench.plan.identity import config_key
    from tests.helpers import run_config

    default, unset = run_config(), run_config("compile=null")
    assert "compile" not in default.to_dict(), "configs from before the switch keep their keys"
    keys = {config_key(c) for c in (run_config("compile=false"), run_config("compile=true"))}
    assert config_key(default) == config_key(unset) and config_key(default) not in keys and len(keys) == 2
    assert (default.compiles("cuda"), default.compiles("cpu")) == (True, False)
    assert not run_config("compile=false").compiles("cuda") and run_config("compile=true").compiles("cpu")


def test_head_dim_unset_or_stated_as_the_widths_share_keeps_the_key_and_another_makes_its_own():
    from odc_bench.plan.identity import config_key
    from tests.helpers import run_config

    default = run_config()
    assert "head_dim" not in default.to_dict()["model"], "models from before head_dim keep their keys"
    stated = run_config(f"model.head_dim={default.model.hidden_size // default.model.num_heads}")
    narrower = run_config(f"model.head_dim={default.model.hidden_size // default.model.num_heads + 16}")
    assert config_key(stated) == config_key(default) != config_key(narrower)
    assert narrower.to_dict()["model"]["head_dim"] == narrower.model.head_size


def test_tables_joined_with_cat_are_refused_in_one_line_naming_the_repeated_header(tmp_path):
    from odc_bench.errors import TableError
    from odc_bench.results.migrate import migrate_table
    from odc_bench.results.table import check_table

    path = tmp_path / "runs.csv"
    append_row(path, {"run_id": "a", "status": "ok", "config": "model:\n  name: tiny\n"})
    text = path.read_text(encoding="utf-8")
    path.write_text(text + text, encoding="utf-8")
    for call in (check_table, migrate_table):
        with pytest.raises(TableError, match=r": it holds its header again as its row 2 .* joined with cat"):
            call(path)
    with pytest.raises(TableError, match="joined with cat"):
        append_row(path, {"run_id": "b", "status": "ok"})
    assert path.read_text(encoding="utf-8") == text + text


def test_a_calibration_rewritten_under_its_name_gives_its_runs_new_keys(tmp_path):
    """A re-run sweep skipped the runs of a recalibrated cost model or simulator fit (the config
    names the file only), keeping the rows of the old fit; a copy of the same fit keeps the key."""
    import json
    import shutil

    from odc_bench.plan.spec import resolve
    from tests.helpers import REPO, run_config

    cost, fit = tmp_path / "cost.json", tmp_path / "compute.json"
    shutil.copy(REPO / "results" / "calibration" / "tiny-cpu.json", cost)
    shutil.copy(REPO / "results" / "gpu" / "h100-2026-11-26" / "compute.json", fit)
    overrides = ("backend=sim", "engine=odc", "balancer=lb_mini", "balancer.cost_model=calibrated",
                 f"balancer.calibration={cost}", "num_minibatches=3", f"backend.hardware.compute_calibration={fit}")

    def key() -> str:
        return resolve(run_config(*overrides)).run_id

    first = key()
    cost.write_text(json.dumps(json.loads(cost.read_text()), indent=4))  # the same fit, laid out anew
    assert key() == first
    cost.write_text(json.dumps({**json.loads(cost.read_text()), "a": 0.0, "b": 1.0}))
    refit = key()
    assert refit != first
    fit.write_text(json.dumps(json.loads(fit.read_text()), indent=2))
    assert key() == refit
    refitted = json.loads(fit.read_text())
    refitted["units"]["head"]["fwd"]["c0"] *= 2
    fit.write_text(json.dumps(refitted))
    assert key() not in (first, refit)


def test_migrate_gives_a_row_of_a_calibrated_cost_model_its_key_where_its_plans_are_unchanged(tmp_path):
    """A row keyed before the key hashed the calibrated cost model's coefficients gets its
    config's key where the calibration now plans what the row recorded (its predicted bubble
    rate); one planned under another fit keeps its own, so a re-run sweep measures it again."""
    import shutil

    from odc_bench.plan.spec import resolve
    from odc_bench.record.row import base_row
    from odc_bench.results.migrate import migrate_table
    from tests.helpers import REPO, run_config

    cost = tmp_path / "cost.json"
    shutil.copy(REPO / "results" / "calibration" / "tiny-cpu.json", cost)
    spec = resolve(run_config("backend=sim", "engine=odc", "balancer=lb_mini", "balancer.cost_model=calibrated",
                              f"balancer.calibration={cost}", "num_minibatches=3"))
    row = {**{c: "" for c in COLUMNS}, **base_row(spec), "status": "ok"}
    elsewhere = {**row, "run_id": "0ld1111111111111", "predicted_bubble_rate": row["predicted_bubble_rate"] + 0.01}
    path = tmp_path / "runs.csv"
    pd.DataFrame([{**row, "run_id": "0ld0000000000000"}, elsewhere], columns=COLUMNS).to_csv(path, index=False)
    assert migrate_table(path) == 2
    assert list(pd.read_csv(path, dtype=str)["run_id"]) == [spec.run_id, "0ld1111111111111"]
    assert migrate_table(path) == 0
