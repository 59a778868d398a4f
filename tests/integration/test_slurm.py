"""The smoke sweep through a real SLURM cluster (submitit): one job per run, one task per rank.

CI (.ci/run) starts a one-node cluster on localhost first (.ci/slurm/start.sh); elsewhere the
test needs `sbatch` on PATH and a cluster it talks to, and skips without one.
"""

import os
import shutil

import pytest

from odc_bench.results.table import read_table
from tests.helpers import run_cli
from tests.helpers.mpi import requires_mpi

if shutil.which("sbatch") is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError("CI=true but sbatch is missing: .ci/run must start SLURM (.ci/slurm/start.sh)")
    pytest.skip("no sbatch on PATH: start a cluster with .ci/slurm/start.sh (as root) to run the SLURM test",
                allow_module_level=True)


@pytest.mark.slow
@pytest.mark.slurm
def test_smoke_sweep_on_slurm_records_its_rows_and_resumes(tmp_path):
    results_dir, sweep_dir = tmp_path / "results", tmp_path / "multirun"
    args = ["sweep=smoke", "hydra/launcher=slurm", f"results_dir={results_dir}", f"hydra.sweep.dir={sweep_dir}"]
    first = run_cli(*args, timeout=420)
    assert first.returncode == 0, first.stderr[-3000:]

    rows = read_table(results_dir / "runs.csv")
    assert len(rows) == 3 and rows["run_id"].is_unique
    assert (rows["status"] == "ok").all(), rows["error"].tolist()
    assert sorted(rows["minibatch_size"]) == [1, 2, 4] and set(rows["world_size"]) == {2}
    for trace in rows["trace"]:
        ranks = set(read_table(results_dir / trace)["rank"])
        assert ranks == {0, 1}, "rank 0 gathered every rank's trace"

    # One SLURM job per run, its two ranks as two tasks: each job folder holds one result per task.
    job_dirs = [d for d in (sweep_dir / ".submitit").iterdir() if list(d.glob("*_result.pkl"))]
    assert len(job_dirs) == 3
    for d in job_dirs:
        assert len(list(d.glob("*_result.pkl"))) == 2, f"{d.name}: expected one result per task (rank)"
        assert not list(d.glob("ranks.*")), "rank 0 removes the ranks' exchange folder"

    submitted = set((sweep_dir / ".submitit").iterdir())
    again = run_cli(*args, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("skipped") == 3, "a re-run skips the runs already in the table"
    assert set((sweep_dir / ".submitit").iterdir()) == submitted, "and submits no job"
    assert len(read_table(results_dir / "runs.csv")) == 3


@pytest.mark.slow
@pytest.mark.slurm
def test_a_run_failing_on_slurm_is_a_failed_row_naming_the_rank(tmp_path):
    results_dir = tmp_path / "results"
    # A learning rate AdamW refuses: the config resolves, every rank fails building its optimizer.
    proc = run_cli("sweep=smoke", "minibatch_size=1", "optim.lr=-1.0", "hydra/launcher=slurm",
                   f"results_dir={results_dir}", f"hydra.sweep.dir={tmp_path / 'multirun'}", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_table(results_dir / "runs.csv")
    assert list(rows["status"]) == ["failed"]
    assert "rank " in rows["error"][0] and "Invalid learning rate" in rows["error"][0], rows["error"][0]


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.mpi
@requires_mpi
def test_an_odc_run_on_the_mpi_transport_runs_as_srun_bootstrapped_mpi_tasks(tmp_path):
    """CI's cluster has one node, so the two tasks share it; MPI stays off shared memory
    (engine.mpi_network_only) so they talk as tasks on two nodes would. The same command with
    hydra.launcher.nodes=2 hydra.launcher.tasks_per_node=1 spans nodes (docs/transport.md)."""
    results_dir, sweep_dir = tmp_path / "results", tmp_path / "multirun"
    proc = run_cli("-m", "hydra/launcher=slurm", "engine=odc", "engine.transport=mpi", "engine.mpi_network_only=true",
                   "num_minibatches=3", "warmup_minibatches=1", "dataset.length_scale=0.00390625",
                   f"results_dir={results_dir}", f"hydra.sweep.dir={sweep_dir}", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_table(results_dir / "runs.csv")
    assert list(rows["status"]) == ["ok"], rows["error"].tolist()
    assert set(read_table(results_dir / rows["trace"][0])["rank"]) == {0, 1}
    (job_dir,) = [d for d in (sweep_dir / ".submitit").iterdir() if list(d.glob("*_result.pkl"))]
    assert len(list(job_dir.glob("*_result.pkl"))) == 2, "one task per rank"
    (script,) = job_dir.glob("*_submission.sh")
    assert "--mpi=pmi2" in script.read_text(), "srun's PMI bootstraps MPICH in the tasks"
