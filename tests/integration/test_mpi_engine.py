"""The ODC engine on the MPI transport through the real worker and the mpiexec launcher:
equivalence with a single process, and a rank killed mid-minibatch named with nothing left."""

import os
from dataclasses import replace
from functools import partial

import pytest

from odc_bench.jobs.train import execute
from odc_bench.plan.spec import resolve
from odc_bench.run.mpiexec import run_mpi
from odc_core.transport.shm import process_start_time
from tests.helpers import run_config
from tests.helpers.mpi import requires_mpi
from tests.helpers.processes import descendants
from tests.helpers.reference import relative_error, train_single_process
from tests.helpers.shm import left_behind
from tests.integration.test_hybrid import HYBRID
from tests.integration.test_reliability import MARGIN_S, SMALL, TIMEOUT_S, killing_entry, since_killed
from tests.integration.test_staleness import SMALL as STALE_SMALL
from tests.integration.test_staleness import SPLITS as STALE_SPLITS

pytestmark = [pytest.mark.slow, pytest.mark.mpi, requires_mpi]
MPI = ("engine=odc", "engine.transport=mpi", "engine.mpi_network_only=true")


def test_odc_over_mpi_with_uneven_counts_matches_a_single_process():
    spec = resolve(run_config(*MPI, *SMALL, f"timeout_s={60}"))
    # Rank 1 idles in minibatch 0, rank 0 in minibatch 2; minibatch 1 splits 3 to 1.
    splits = [([0, 1, 2, 3], []), ([0, 1, 2], [3]), ([], [0, 1, 2, 3])]
    spec = replace(spec, minibatches=[replace(mb, plan=[[[i] for i in mine], [[i] for i in theirs]])
                                      for mb, (mine, theirs) in zip(spec.minibatches, splits, strict=True)])
    assert spec.config.engine.options.transport == "mpi"
    params = run_mpi(spec, collect_params=True)[0]["params"]
    reference, _ = train_single_process(spec)
    assert relative_error(params, reference) < 1e-5


def test_stale_odc_over_mpi_equals_delayed_gradient_training_in_one_process():
    """Staleness over MPI's network path: each owner applies its steps from inside its own
    training (the engine's serve points), reading the pushes that landed in its window."""
    spec = resolve(run_config(*MPI, *STALE_SMALL, "engine.staleness=1", f"num_minibatches={len(STALE_SPLITS)}",
                              f"timeout_s={60}"))
    spec = replace(spec, minibatches=[replace(mb, plan=[[[i] for i in mine], [[i] for i in theirs]])
                                      for mb, (mine, theirs) in zip(spec.minibatches, STALE_SPLITS, strict=True)])
    params = run_mpi(spec, collect_params=True)[0]["params"]
    reference, _ = train_single_process(spec, staleness=1)
    # The bound of the shm test (test_staleness.py): fp32 pushes land in any order.
    assert relative_error(params, reference) < 1e-4
    assert relative_error(train_single_process(spec, staleness=0)[0], reference) > 1e-3


def test_odc_hybrid_over_mpi_matches_a_single_process():
    """Hybrid sharding over MPI's network path: what ODC runs across real nodes, 4 ranks as 2
    emulated nodes, node 1 idle in minibatch 0 (the shm version, which also checks which ranks a
    rank reads: tests/integration/test_hybrid.py)."""
    spec = resolve(run_config(*MPI, *HYBRID, "engine=odc", f"timeout_s={60}"))
    splits = [[[0, 1], [2, 3], [], []], [[0], [1], [2], [3]], [[], [0, 1, 2], [3], []]]
    spec = replace(spec, minibatches=[replace(mb, plan=[[[i] for i in mine] for mine in split])
                                      for mb, split in zip(spec.minibatches, splits, strict=True)])
    params = run_mpi(spec, collect_params=True)[0]["params"]
    reference, _ = train_single_process(spec)
    assert relative_error(params, reference) < 1e-5


def test_a_rank_killed_mid_minibatch_fails_the_mpi_run_by_name_and_leaves_nothing(results_dir, tmp_path,
                                                                                  sigkill_window):
    spec = resolve(run_config(*MPI, *SMALL))
    shm_before = set(os.listdir("/dev/shm"))
    children_before = set(descendants(os.getpid()))
    row = execute(spec, results_dir, launch=partial(run_mpi, entry=partial(killing_entry, str(tmp_path))))
    assert since_killed(tmp_path) < TIMEOUT_S + MARGIN_S
    assert row["status"] == "failed"
    assert row["error"] == "rank 1 died (killed by SIGKILL) after 1 of 3 minibatches"
    ranks = [(tmp_path / f"rank{r}").read_text().split() for r in range(2)]
    assert all(process_start_time(int(pid)) != int(start) for pid, start, _ in ranks), "no rank process is left"
    assert set(descendants(os.getpid())) <= children_before, "mpiexec and its proxies are gone"
    assert not left_behind(shm_before), "nothing left in /dev/shm"
