"""The ranks stage: each rank's training loop (worker.py) and its event trace (trace.py), and
the ways to start ranks: one launcher (launch.py) with forked processes (local.py) or MPICH's
mpiexec (mpiexec.py) as how ranks start, functions on N processes for benchmarks and tests
(ranks.py), and SLURM tasks (slurm_task.py).

Local ranks fork from a server that has imported the worker (and torch with it) once, so a
sweep pays torch's import time once instead of once per rank per run. The preload list is
process-wide (the last call wins), so it is set here, once, for every launcher in this package.
"""

import multiprocessing

multiprocessing.set_forkserver_preload(["odc_bench.run.worker"])
