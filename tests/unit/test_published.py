"""The published GPU measurements table is whole: every point sourced, every gap an assumption."""

from pathlib import Path

import pandas as pd
import pytest

PUBLISHED = Path(__file__).resolve().parents[2] / "results" / "published"
# A row's shape, run and hardware: a blank here must be explained in `assumptions`.
DESCRIBED = [
    "model",
    "n_layers",
    "d_model",
    "n_heads",
    "n_kv_heads",
    "ffn_hidden",
    "vocab",
    "seq_len",
    "microbatch_per_gpu",
    "gpus",
    "gpus_per_node",
    "gpu",
    "precision",
    "activation_checkpointing",
    "compile",
]
CHECKPOINTING = {"none", "full", "selective (op)", "selective (blocks)"}


@pytest.fixture(scope="module")
def points() -> pd.DataFrame:
    return pd.read_csv(PUBLISHED / "points.csv", dtype={"source_commit": str})


def test_enough_points_from_enough_independent_sources(points: pd.DataFrame) -> None:
    assert len(points) >= 15
    assert points["source_id"].nunique() >= 4
    assert points["point_id"].is_unique


def test_every_point_names_its_source_down_to_the_commit(points: pd.DataFrame) -> None:
    for column in ["source_title", "source_url", "source_section", "source_commit"]:
        assert points[column].notna().all(), column
    assert points["source_url"].str.startswith("https://").all()
    # The URL pins the same commit the row names, so the page read can be read again.
    assert points.apply(lambda row: row["source_commit"] in row["source_url"], axis=1).all()


def test_shape_run_and_hardware_are_filled(points: pd.DataFrame) -> None:
    missing = points[DESCRIBED].isna().stack()
    assert not missing.any(), list(missing[missing].index)
    assert points["assumptions"].notna().all()


def test_values_are_in_their_units(points: pd.DataFrame) -> None:
    assert (points["tokens_per_s_per_gpu"] > 0).all()
    mfu = points["mfu"].dropna()
    assert ((mfu > 0) & (mfu <= 1)).all()
    assert points.loc[points["mfu"].notna(), "mfu_formula"].notna().all()
    assert set(points["activation_checkpointing"]) <= CHECKPOINTING
    assert set(points["compile"]) <= {"on", "off"}
    assert set(points["mlp"]) <= {"gelu", "swiglu"}
    assert (points["gpus"] % points["gpus_per_node"] == 0).all()
    assert (points["n_heads"] % points["n_kv_heads"] == 0).all()


def test_paper_relative_results_keep_their_marks() -> None:
    relative = pd.read_csv(PUBLISHED / "paper_relative.csv")
    assert set(relative["mark"]) <= {"P", "R"}
    assert relative["section_in_shared_PAPER_md"].notna().all()
    assert (relative["source_url"] == "https://arxiv.org/abs/2601.19362").all(), "the paper itself"
