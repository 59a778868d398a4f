"""Do survivors outlive a SIGKILLed peer? Rank 2 of 3 kills itself after the others left a
barrier; the survivors log a line every 0.1 s for 2 s to /tmp/dead_peer_probe.<rank>, with
POKE=1 polling MPI (Iprobe every 0.5 ms) meanwhile. Run as
mpiexec -disable-auto-cleanup -n 3 sh -c "trap '' USR1; python dead_peer_probe.py": without the
trap, hydra's SIGUSR1 can reach a survivor before the line below ignores it."""

import os
import signal
import threading
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # hydra's notice of a failed rank
log = open(f"/tmp/dead_peer_probe.{rank}", "w", encoding="utf-8")  # noqa: SIM115 - kept open until os._exit
comm.Barrier()


def poke(poke_comm) -> None:
    while True:
        poke_comm.Iprobe()
        time.sleep(5e-4)


if os.environ.get("POKE"):
    threading.Thread(target=poke, args=(comm.Dup(),), daemon=True).start()
if rank == 2:
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
for i in range(20):
    time.sleep(0.1)
    log.write(f"t{i}\n")
    log.flush()
log.write("alive\n")
log.flush()
os._exit(0)
