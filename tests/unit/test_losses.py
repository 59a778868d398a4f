"""A minibatch's loss is its ranks' loss sums over its labelled tokens; a rank's NaN (a loss that
diverged) keeps it NaN in the row and the loss figures, where pandas' sum skipped it and a
diverged run recorded a loss of 0, the best there is."""

from __future__ import annotations

import math

import pandas as pd

from odc_bench.record.metrics import minibatch_losses
from odc_bench.results.table import read_table
from paper_figures import convergence, staleness
from tests.helpers import odc_bench


def _trace(rank1_loss_sum: float) -> pd.DataFrame:
    """Two ranks, two minibatches of one 11-token sample per rank (10 labelled tokens each)."""
    rows = []
    for k in range(2):
        for rank, loss in ((0, 5.0), (1, rank1_loss_sum if k == 1 else 5.0)):
            rows += [dict(rank=rank, minibatch=k, kind="microbatch", t0=k, t1=k + 0.5, tokens=11, samples=1,
                          loss_sum=float("nan")),
                     dict(rank=rank, minibatch=k, kind="minibatch", t0=k, t1=k + 1.0, tokens=0, samples=0,
                          loss_sum=loss)]
    return pd.DataFrame(rows)


def test_a_ranks_nan_loss_keeps_the_minibatchs_loss_nan():
    assert minibatch_losses(_trace(5.0), [20, 20]) == [0.5, 0.5]
    finite, diverged = minibatch_losses(_trace(float("nan")), [20, 20])
    assert finite == 0.5 and math.isnan(diverged)
    for figure in (convergence, staleness):
        losses = figure.loss_curve(_trace(float("nan")))["loss"].tolist()
        assert losses[0] == 0.5 and math.isnan(losses[1]), figure.__name__


def test_a_run_whose_loss_diverges_records_nan_not_zero(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert odc_bench("optim.lr=1e30", "num_minibatches=3", "warmup_minibatches=1", f"results_dir={tmp_path}") == 0
    row = read_table(tmp_path / "runs.csv").iloc[0]
    assert row["status"] == "ok" and math.isnan(float(row["loss_last"])), row["loss_last"]
