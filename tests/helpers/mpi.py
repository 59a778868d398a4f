"""Whether MPICH's mpiexec and mpi4py are here: the MPI transport's tests skip, saying why, without them."""

from __future__ import annotations

import pytest

from odc_bench.errors import ConfigError
from odc_bench.run.mpiexec import mpiexec_path


def _missing() -> str | None:
    try:
        mpiexec_path()
        import mpi4py  # noqa: F401
    except (ConfigError, ImportError) as e:
        return str(e)
    return None


MISSING = _missing()
requires_mpi = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))
