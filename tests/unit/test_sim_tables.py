"""The committed simulated tables stay reproducible: rows of results/sim_* planned and simulated
again from their own config give their run key (a re-run sweep skips them) and every planned and
simulated column to the last bit.

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
    "sim_paper": ["1c14b39832db2f53",  # ODC + LB-Mini, 32B LongAlign, 4 nodes
                  "5e26484210568e5e",  # Collective + LB-Micro, 32B SWE-smith
                  "30850f1eaddaf323"],  # ODC + LB-Mini, 14B GRPO
    "sim_paper_fit": ["e64d3080b4a4a2fa",  # Collective + verl, fitted A100 profile
                      "d0535de4bec9aa4a"],  # ODC + LocalSort
    "sim_scaling": ["a17b895353e54509",  # topology-aware fetch
                    "a575ac05bb047992",  # ODC, hybrid sharding
                    "baa43c40f3006afe"],  # Collective (HSDP), hybrid sharding
    "sim_ssp": ["46903c1b86f9d439"],  # stale-synchronous ODC + LB-Carry, staleness 1
}
COLUMNS = ["run_id", "max_tokens", "samples", "len_mean", "len_p50", "len_p99", "len_max", "samples_per_s",
           "tokens_per_s", "bubble_rate", "predicted_bubble_rate", "compute_s", "sync_s", "mem_estimate_mb",
           "mem_limit_mb", "wall_s"]


@pytest.mark.parametrize("table,run_id", [(t, r) for t, ids in ROWS.items() for r in ids],
                         ids=[f"{t}:{r}" for t, ids in ROWS.items() for r in ids])
def test_a_committed_simulated_row_comes_out_the_same(table, run_id):
    rows = pd.read_csv(REPO / "results" / table / "runs.csv", dtype={"run_id": str})
    row = rows[rows["run_id"] == run_id].iloc[0]
    spec = resolve(run_config(yaml.safe_load(row["config"])))
    again = sim_row(spec, simulate(spec, trace=False), "")
    assert {c: again[c] for c in COLUMNS} == {c: row[c] for c in COLUMNS}
