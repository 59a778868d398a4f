"""What a sharded checkpoint costs: seconds to save and to load, and bytes per rank.

`python -m odc_bench.tools.checkpoint_cost [--model tiny] [--ranks 2] [--repeats 5]` wraps the
harness's model with each engine on this machine's CPU ranks, trains one minibatch (so that the
optimizer has its moments), then saves and loads a checkpoint (odc_core/checkpoint.py) `repeats`
times into a temporary folder, and prints on rank 0 the median seconds with their range and each
rank's bytes beside the model's fp32 parameter bytes. docs/checkpoints.md records a run.
"""

from __future__ import annotations

import statistics
import tempfile
import time
import uuid
from datetime import timedelta
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

from odc_bench.config.model import ModelConfig
from odc_bench.data.batches import packed_batch
from odc_bench.errors import CommandParser, ConfigError, command_name, ends_cleanly, fail, positive_int
from odc_bench.models.decoder import build_model
from odc_bench.plan.spec import host_model
from odc_bench.run.ranks import run_ranks
from odc_core import checkpoint
from odc_core.engine.base import EngineContext
from odc_core.engine.build import make_engine


def _rank(rank: int, world: int, store: dist.Store, cfg: ModelConfig, engine_name: str, repeats: int, folder: str,
          job: str) -> dict:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    engine = make_engine(engine_name, EngineContext(torch.device("cpu"), dist.PrefixStore("engine", store),
                                                    f"{job}{engine_name}", 120.0, "fp32"))
    try:
        net = build_model(cfg, 0, torch.device("cpu"))
        wrapped = engine.wrap(net, net.units())
        engine.configure_optimizer(partial(torch.optim.AdamW, lr=1e-4, fused=True))
        ids = torch.randint(0, cfg.vocab_size, (64,), generator=torch.Generator().manual_seed(rank))
        engine.begin_minibatch()
        wrapped(**packed_batch([ids])).backward()
        engine.finish_minibatch()
        saves, loads = [], []
        root = Path(folder) / engine_name
        for step in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            saved = checkpoint.save(engine, root, step)
            saves.append(time.perf_counter() - t0)
        sizes = [p.stat().st_size for p in sorted(saved.glob("*.distcp"))]
        for _ in range(repeats):
            fresh = make_engine(engine_name, EngineContext(torch.device("cpu"), dist.PrefixStore(f"l{_}", store),
                                                           f"{job}{engine_name}l{_}", 120.0, "fp32"))
            again = build_model(cfg, 0, torch.device("cpu"))
            fresh.wrap(again, again.units())
            fresh.configure_optimizer(partial(torch.optim.AdamW, lr=1e-4, fused=True))
            dist.barrier()
            t0 = time.perf_counter()
            checkpoint.load(fresh, saved)
            loads.append(time.perf_counter() - t0)
            fresh.close()
        params = sum(p.numel() * 4 for p in build_model(cfg, 0, torch.device("cpu")).parameters())
        return dict(saves=saves, loads=loads, sizes=sizes, param_bytes=params)
    finally:
        engine.close()
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    ap = CommandParser(command_name(__spec__.name), description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="a model config (python -m odc_bench --help lists them) or "
                                                    "a Hugging Face model folder")
    ap.add_argument("--ranks", type=positive_int, default=2, help="CPU ranks the model is sharded over")
    ap.add_argument("--repeats", type=positive_int, default=5, help="saves and loads timed per engine (median)")
    args = ap.parse_args(argv)
    try:
        cfg = host_model(args.model, args.ranks)
    except ConfigError as e:
        fail(e, ap.prog)
    job = uuid.uuid4().hex[:6]
    with tempfile.TemporaryDirectory(prefix="odc-ckpt-") as folder:
        for engine in ("collective", "odc"):
            r = run_ranks(_rank, args.ranks, cfg, engine, args.repeats, folder, job, timeout_s=600)[0]
            mb, saves, loads = 1e6, r["saves"], r["loads"]
            sizes = ", ".join(f"{s / mb:.2f}" for s in r["sizes"])
            print(f"{engine:10s} model={args.model} on {args.ranks} CPU ranks: save {statistics.median(saves):.3f} s "
                  f"({min(saves):.3f}-{max(saves):.3f}), load {statistics.median(loads):.3f} s "
                  f"({min(loads):.3f}-{max(loads):.3f}), median of {args.repeats}; files per rank {sizes} MB; "
                  f"fp32 parameters {r['param_bytes'] / mb:.2f} MB (parameters and two AdamW moments: "
                  f"{3 * r['param_bytes'] / mb / args.ranks:.2f} MB per rank)")

if __name__ == "__main__":
    with ends_cleanly(command_name(__spec__.name)):
        main()
