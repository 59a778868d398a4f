"""The ranks stage: each rank's training loop (worker.py) and its event trace (trace.py), and
the ways to start ranks: one launcher (launch.py) with forked processes (local.py) or MPICH's
mpiexec (mpiexec.py) as how ranks start, functions on N processes for benchmarks and tests
(ranks.py), and SLURM tasks (slurm_task.py).

Local ranks fork from a server that has imported torch and the worker once, so a sweep pays
torch's import time once instead of once per rank per run. torch._dynamo too: torch imports it
on the first optimizer a process builds (and FSDP2 on its first fully_shard), which every rank
does, and it was most of a rank's start-up. The preload list is process-wide (the last call
wins), so it is set here, once, for every launcher in this package.
"""

import multiprocessing

multiprocessing.set_forkserver_preload(["torch", "torch._dynamo", "odc_bench.run.worker"])
