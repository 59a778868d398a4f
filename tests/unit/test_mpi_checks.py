"""The MPI transport's refusals that depend on the machine: no mpiexec here, no pmi2 in srun."""

import signal
import sys

import pytest

from odc_bench.cli.slurm import check_srun_mpi
from odc_bench.errors import ConfigError
from odc_bench.run.launch import RankExit
from odc_bench.run.launch import failure as _failure
from odc_bench.run.mpiexec import mpiexec_path


def test_a_machine_without_mpiexec_is_told_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match=r"MPICH's mpiexec \(hydra\), which is not installed here; "
                                          r"pip install 'odc-bench\[mpi\]'"):
        mpiexec_path()


def test_a_cluster_whose_srun_lacks_pmi2_is_refused_by_name(tmp_path, monkeypatch):
    srun = tmp_path / "srun"
    srun.write_text("#!/bin/sh\nprintf 'MPI plugin types are...\\n\\tnone\\n\\tpmix\\n'\n")
    srun.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match=r"srun --mpi=pmi2, which this cluster's srun lacks "
                                          r"\(srun --mpi=list: none, pmix\)"):
        check_srun_mpi()
    srun.write_text("#!/bin/sh\nprintf 'MPI plugin types are...\\n\\tnone\\n\\tpmi2\\n'\n")
    check_srun_mpi()  # accepted


def test_the_rank_that_died_first_is_named_whatever_the_ranks_order():
    """MPICH can crash a rank whose peer vanished (SIGSEGV in its next call): the peer that died
    first is the cause, so the run names it even when the crashed rank has the lower number."""
    killed = RankExit(rank=1, status=128 + signal.SIGKILL, error=None, ended_at=10.0)
    crashed = RankExit(rank=0, status=128 + signal.SIGSEGV, error=None, ended_at=10.05)
    assert _failure([crashed, killed], "after 1 of 3 minibatches") == \
        "rank 1 died (killed by SIGKILL) after 1 of 3 minibatches"
    raised = RankExit(rank=0, status=1, error="RuntimeError: peer 1 is gone", ended_at=9.0)
    assert _failure([raised, crashed], "").startswith("rank 0 died (killed by SIGSEGV)"), \
        "a rank that died without a word comes before one that raised"
