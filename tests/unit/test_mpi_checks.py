"""The MPI transport's refusals that depend on the machine: no mpiexec here, no pmi2 in srun."""

import sys

import pytest

from odc_bench.cli.slurm import check_srun_mpi
from odc_bench.errors import ConfigError
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
