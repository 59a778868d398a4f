"""Does a one-sided op complete while its owner sleeps outside MPI, and what does the owner's
process spend meanwhile? Rank 0 sleeps 3 s; the others get 4 B, get 4 MiB, accumulate 4 MiB and
fetch-and-add into its windows, timing each. POKE=<seconds>: every rank runs a thread that calls
Iprobe at that interval, as odc_core/transport/mpi.py does. Run under mpiexec (docs/transport.md)."""

import os
import resource
import threading
import time

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
N = 1 << 20
buf = np.zeros(N, dtype=np.float32)
counter = np.zeros(1, dtype=np.int64)
win, cwin = MPI.Win.Create(buf, 4, comm=comm), MPI.Win.Create(counter, 8, comm=comm)
for w in (win, cwin):
    w.Lock_all(MPI.MODE_NOCHECK)
stop = threading.Event()


def poke(poke_comm, interval: float) -> None:
    while not stop.wait(interval):
        poke_comm.Iprobe()


if os.environ.get("POKE"):
    threading.Thread(target=poke, args=(comm.Dup(), float(os.environ["POKE"])), daemon=True).start()
comm.alltoall([None] * size)  # every pair connected while all are in MPI
buf[:] = np.arange(N, dtype=np.float32)
comm.Barrier()
if rank == 0:
    before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    time.sleep(3)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    print(f"owner: {cpu:.3f}s CPU over {time.perf_counter() - t0:.2f}s asleep", flush=True)
else:
    time.sleep(0.2)
    one, out, src = np.empty(1, np.float32), np.empty(N, np.float32), np.ones(N, np.float32)
    old, inc = np.zeros(1, np.int64), np.ones(1, np.int64)
    for what, w, op in [("get 4 B", win, lambda: win.Get([one, MPI.FLOAT], 0)),
                        ("get 4 MiB", win, lambda: win.Get([out, MPI.FLOAT], 0)),
                        ("accumulate 4 MiB", win, lambda: win.Accumulate([src, MPI.FLOAT], 0, op=MPI.SUM)),
                        ("fetch_and_op", cwin, lambda: cwin.Fetch_and_op([inc, MPI.INT64_T], [old, MPI.INT64_T],
                                                                          0, 0, MPI.SUM))]:
        t = time.perf_counter()
        op()
        w.Flush(0)
        print(f"rank {rank}: {what} {time.perf_counter() - t:.4f}s", flush=True)
comm.Barrier()
stop.set()
for w in (win, cwin):
    w.Unlock_all()
    w.Free()
