"""Time one AdamW step over FSDP2's sharded parameters: the for-loop, foreach and fused kernels.

`python -m odc_bench.tools.optimizer_step [--model tiny] [--ranks 2] [--steps 20]` shards the
harness's model with fully_shard (a unit per decoder layer and the root, as the collective engine
does) over gloo ranks on this machine's CPU, gives every parameter a gradient, and prints each
kernel's median step time on rank 0. The collective engine uses the fastest (odc_core/engine/
fsdp2.py): the optimizer step is a cost per minibatch that is not idle time, so a slow baseline
optimizer would inflate ODC's measured speedup (docs/odc_engine.md, "A fair baseline on CPU").
"""

from __future__ import annotations

import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from odc_bench.config.model import ModelConfig
from odc_bench.errors import CommandParser, ConfigError, command_name, ends_cleanly, fail, positive_int
from odc_bench.models.decoder import build_model
from odc_bench.plan.spec import host_model

# name: (foreach, fused) as torch.optim.AdamW takes them
KERNELS = {"for-loop": (False, None), "foreach": (True, None), "fused": (None, True)}


def _rank(rank: int, world: int, model: str, cfg: ModelConfig, steps: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    times = {}
    for name, (foreach, fused) in KERNELS.items():
        net = build_model(cfg, 0, torch.device("cpu"))
        mesh = init_device_mesh("cpu", (world,))
        for layer in net.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(net, mesh=mesh)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-4, foreach=foreach, fused=fused)
        for p in net.parameters():
            p.grad = torch.ones_like(p)
        spent = []
        for _ in range(steps + 2):  # the first two allocate the moments
            t0 = time.perf_counter()
            opt.step()
            spent.append(time.perf_counter() - t0)
        times[name] = statistics.median(spent[2:])
    if rank == 0:
        tensors = sum(1 for _ in net.parameters())
        print(f"AdamW step over model={model}'s {tensors} DTensor parameters on {world} CPU ranks "
              f"(median of {steps}):")
        for name, t in times.items():
            print(f"  {name:<9} {t * 1e3:7.2f} ms")
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    ap = CommandParser(command_name(__spec__.name), description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", help="a model config (python -m odc_bench --help lists them) or "
                                                    "a Hugging Face model folder")
    ap.add_argument("--ranks", type=positive_int, default=2, help="CPU ranks the parameters are sharded over")
    ap.add_argument("--steps", type=positive_int, default=20, help="optimizer steps timed per kernel (median)")
    args = ap.parse_args(argv)
    try:
        cfg = host_model(args.model, args.ranks)
    except ConfigError as e:
        fail(e, ap.prog)
    with socket.socket() as s:  # a free port for the ranks' rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(args.ranks, args.model, cfg, args.steps, port), nprocs=args.ranks)


if __name__ == "__main__":
    with ends_cleanly(command_name(__spec__.name)):
        main()
