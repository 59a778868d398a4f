"""The committed simulated tables stay reproducible: rows of results/sim_* planned and simulated
again from their own config give every planned and simulated column to the last bit.

The rows cover each timeline the simulator has (collective, with hybrid sharding; ODC, with
contention across nodes, hybrid sharding and topology-aware fetch; stale-synchronous ODC) and
the balancers behind them; a faster planner or simulator must leave them all unchanged."""

import pandas as pd
import pytest
import yaml

from odc_bench.config.run import run_config
from odc_bench.plan.spec import resolve
from odc_bench.record.row import sim_row
from odc_bench.sim import simulate
from tests.helpers import REPO

ROWS = {
    "sim_paper": ["ea3b02c830528d11",  # ODC + LB-Mini, 32B LongAlign, 4 nodes
                  "42e9242e58a54329",  # Collective + LB-Micro, 32B SWE-smith
                  "fb5a27d91ffc72a0"],  # ODC + LB-Mini, 14B GRPO
    "sim_paper_fit": ["5902a977b6485903",  # Collective + verl, fitted A100 profile
                      "61f2ab176b626e62"],  # ODC + LocalSort
    "sim_scaling": ["e03c316edc6dfc1f",  # topology-aware fetch
                    "32765fa04f27bca5",  # ODC, hybrid sharding
                    "2b5f180ecd3b4990"],  # Collective (HSDP), hybrid sharding
    "sim_ssp": ["12d15e3c8029ec3a"],  # stale-synchronous ODC + LB-Carry, staleness 1
}
COLUMNS = ["max_tokens", "samples", "len_mean", "len_p50", "len_p99", "len_max", "samples_per_s", "tokens_per_s",
           "bubble_rate", "predicted_bubble_rate", "compute_s", "sync_s", "mem_estimate_mb", "mem_limit_mb", "wall_s"]


@pytest.mark.parametrize("table,run_id", [(t, r) for t, ids in ROWS.items() for r in ids],
                         ids=[f"{t}:{r}" for t, ids in ROWS.items() for r in ids])
def test_a_committed_simulated_row_comes_out_the_same(table, run_id):
    row = pd.read_csv(REPO / "results" / table / "runs.csv").set_index("run_id").loc[run_id]
    spec = resolve(run_config(yaml.safe_load(row["config"])), reuse=False)
    again = sim_row(spec, simulate(spec, trace=False), "")
    assert {c: again[c] for c in COLUMNS} == {c: row[c] for c in COLUMNS}
