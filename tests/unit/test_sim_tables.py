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
    "sim_paper": ["17aad6a4df187ab8",  # ODC + LB-Mini, 32B LongAlign, 4 nodes
                  "443f0ef10f40e107",  # Collective + LB-Micro, 32B SWE-smith
                  "647449bdbb457ec1"],  # ODC + LB-Mini, 14B GRPO
    "sim_paper_fit": ["38cdf69ac301c4e6",  # Collective + verl, fitted A100 profile
                      "2ab21ff5e010e3a7"],  # ODC + LocalSort
    "sim_scaling": ["93f3af2c727c76fc",  # topology-aware fetch
                    "f57cc68327172e5c",  # ODC, hybrid sharding
                    "c937e8f7204d55fe"],  # Collective (HSDP), hybrid sharding
    "sim_ssp": ["f15422182df93569"],  # stale-synchronous ODC + LB-Carry, staleness 1
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
