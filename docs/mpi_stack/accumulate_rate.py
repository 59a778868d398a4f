"""Accumulate and get rates into rank 0's window while every other rank pushes at once (rank 0
waits in a barrier): 10 x 4 MiB of fp32 per rank. Run under mpiexec (docs/transport.md)."""

import time

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
N, K = 1 << 20, 10
buf = np.zeros(N, dtype=np.float32)
win = MPI.Win.Create(buf, 4, comm=comm)
win.Lock_all(MPI.MODE_NOCHECK)
comm.alltoall([None] * size)
src, out = np.ones(N, np.float32), np.empty(N, np.float32)
for what in ("get", "accumulate"):
    comm.Barrier()
    if rank != 0:
        t = time.perf_counter()
        for _ in range(K):
            win.Accumulate([src, MPI.FLOAT], 0, op=MPI.SUM) if what == "accumulate" else win.Get([out, MPI.FLOAT], 0)
            win.Flush(0)
        print(f"rank {rank}: {what} {K * N * 4 / (time.perf_counter() - t) / 1e6:.1f} MB/s", flush=True)
    comm.Barrier()
if rank == 0:
    print("sum exact:", bool((buf == K * (size - 1)).all()))
win.Unlock_all()
win.Free()
