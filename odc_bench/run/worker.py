"""The per-rank training loop, written once for every engine.

A rank receives its microbatches from the plan, runs forward and backward through the
engine-wrapped model, and calls no collective itself between begin_minibatch() and
finish_minibatch(); the engine applies the optimizer step. The loss of each microbatch is
divided by the whole minibatch's labelled token count, so the summed gradient does not depend
on how samples are spread over ranks.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import signal
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from odc_bench.data.batches import on_device, packed_batch
from odc_bench.data.tokens import token_source
from odc_bench.files import atomic_write_text
from odc_bench.forked import cpu_share
from odc_bench.models.checkpointing import layer_contexts
from odc_bench.models.decoder import build_model, compile_dense
from odc_bench.plan.identity import checkpoint_folder
from odc_bench.plan.spec import Minibatch, RunSpec
from odc_bench.provenance import git_commit
from odc_bench.run import profile, trace
from odc_bench.run.optim import adamw
from odc_core import checkpoint
from odc_core.engine.base import DataParallelEngine, EngineContext
from odc_core.engine.build import make_engine
from odc_core.liveness import Liveness, one_line
from odc_core.transport.base import PeerTimeout

# Store counter of minibatches rank 0 has finished: the launcher shows it as the run's progress.
MINIBATCHES_DONE = "minibatches_done"


@dataclass
class RankJob:
    spec: RunSpec
    store_host: str
    store_port: int
    out_dir: str
    # Unique per execution of a run: names the run's shared-memory segments.
    job_id: str
    # CPU threads each rank computes with (cuda ranks ignore it).
    threads: int = 1
    # Rank 0 also saves the final unsharded parameters (params.pt), for engine comparisons.
    collect_params: bool = False
    # The rank whose process hosts the store (SLURM: rank 0); None: the launcher hosts it.
    store_rank: int | None = None


def threads_per_rank(spec: RunSpec, ranks_on_host: int, ranks_in_task: int) -> int:
    """CPU threads a rank computes with: the config's, else its share of the CPUs (cpu_share)."""
    return spec.config.threads_per_rank or cpu_share(ranks_on_host, ranks_in_task)


def rank_device(spec: RunSpec, local_rank: int) -> torch.device:
    if spec.device_type == "cuda":
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def my_microbatches(engine: DataParallelEngine, mb: Minibatch, rank: int, claim_base: int) -> Iterator[list[int]]:
    """This rank's microbatches: its part of a static plan, or queue entries claimed at run time.

    Claims go through the engine's shared counter, which no rank resets: every rank's last
    claim of a minibatch fails (it ran past the queue), so minibatch k starts at the sum of
    (queue length + world size) over earlier minibatches. No rank claims for k + 1 before
    every rank has made its failing claim for k: that happens before the minibatch barrier.
    """
    if mb.queue is None:
        yield from mb.plan[rank]
        return
    while (index := engine.claim() - claim_base) < len(mb.queue):
        yield mb.queue[index]


def connect_store(job: RankJob, world_size: int, timeout_s: float) -> dist.TCPStore:
    """A client of the run's store; when it cannot be reached, the error names who hosts it."""
    try:
        return dist.TCPStore(job.store_host, job.store_port, world_size, is_master=False,
                             timeout=timedelta(seconds=timeout_s))
    except RuntimeError as e:
        where = f"the run's store at {job.store_host}:{job.store_port}"
        if job.store_rank is not None:
            raise PeerTimeout(job.store_rank, where, timeout_s) from None
        raise TimeoutError(f"timed out after {timeout_s:.1f}s waiting for the launcher: {where} "
                           f"({one_line(e)})") from None


def load_before_baseline(profiling: bool, device: torch.device) -> None:
    """Load what a rank keeps for the rest of its life before it takes its memory baseline, so
    that its peak counts what training holds, however the rank was started: Dynamo, which
    torch's optimizers import at their first parameter group (the fork server preloads it for
    forked ranks; MPI ranks and SLURM tasks import it themselves), and, when it profiles, what
    profiling loads (profile.prepare)."""
    import torch._dynamo  # noqa: F401

    if profiling:
        profile.prepare(device)


def run_rank(rank: int, job: RankJob, local_rank: int | None = None) -> None:
    """Train this rank's share of the run. When a peer died, the error names it (see liveness.py)."""
    spec, config = job.spec, job.spec.config
    world = spec.world_size
    device = rank_device(spec, rank if local_rank is None else local_rank)
    if device.type == "cpu":
        torch.set_num_threads(job.threads)
    else:
        torch.cuda.set_device(device)
    timeout_s = config.timeout_s
    store = connect_store(job, world, timeout_s)
    # A launcher that hosts the store and is gone (killed, or by the kernel for memory) reads no
    # result and writes no row, and a wait on a peer that died with it would last timeout_s: the
    # rank ends at once, by the SIGTERM its launcher would have sent (its segments removed).
    lost = None if job.store_rank is not None else functools.partial(os.kill, os.getpid(), signal.SIGTERM)
    # Connections of its own: a request the heap or gloo left pending on `store` cannot hold it up.
    liveness = Liveness(connect_store(job, world, timeout_s), connect_store(job, world, timeout_s), rank, world,
                        timeout_s, job.store_rank, lost)
    recorder = trace.Recorder(rank)
    engine = None
    finished = False
    try:
        liveness.rendezvous()
        # On CUDA, gloo beside NCCL: object collectives (a checkpoint's RNG states) and the ODC
        # engine's scalar reductions stay on the host, so ranks sharing one GPU never start an
        # NCCL communicator, which refuses two ranks on one device.
        dist.init_process_group("cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo", store=store, rank=rank,
                                world_size=world, timeout=timedelta(seconds=timeout_s))
        load_before_baseline(config.profile_minibatch is not None, device)
        recorder.start(cuda=device.type == "cuda")
        engine = make_engine(config.engine.name, EngineContext(device, store, job.job_id, timeout_s, config.precision),
                             config.engine.options)
        engine.trace, engine.clock = recorder.add, recorder.now
        model = build_model(config.model, config.seed, device)
        model.checkpointed = layer_contexts(config.backend, config.model.num_layers)
        if config.compiles(device.type):
            compile_dense(model)
        wrapped = engine.wrap(model, model.units())
        trace.instrument(recorder, model.named_units())
        engine.configure_optimizer(adamw(config.optim))
        folder = checkpoint_folder(config, spec.run_id)
        start, claim_base = (resume(engine, folder, rank, spec.run_id) if config.checkpoint.resume == "auto"
                             else (0, 0))
        if rank == 0 and start:  # the launcher's progress counts the run's minibatches, those done before too
            store.add(MINIBATCHES_DONE, start)
        recorder.enabled = True
        tokens_of = token_source(config.dataset)
        collect_garbage_between_minibatches()
        for k, mb in enumerate(spec.minibatches):
            if k < start:
                continue
            recorder.minibatch, recorder.microbatch = k, -1
            profiler = profile.start(device) if k == config.profile_minibatch else None
            recorder.profiling = profiler is not None
            t_mb = recorder.now()
            engine.begin_minibatch()
            loss_sum = torch.zeros((), device=device)
            for j, micro in enumerate(my_microbatches(engine, mb, rank, claim_base)):
                recorder.microbatch = j
                docs = [tokens_of(config.seed, mb.sample_ids[i], mb.lengths[i], config.model.vocab_size)
                        for i in micro]
                batch = on_device(packed_batch(docs), device)
                t0 = recorder.now()
                loss = wrapped(**batch)
                t1 = recorder.now()
                (loss * (engine.loss_scale / mb.labelled_tokens)).backward()
                recorder.add("microbatch", t0, recorder.now(), fwd_end=t1,
                             tokens=sum(mb.lengths[i] for i in micro), samples=len(micro))
                loss_sum += loss.detach()
            if mb.queue is not None:
                claim_base += len(mb.queue) + world
            recorder.microbatch = -1
            engine.finish_minibatch()  # the engine reports its sync and its optimizer step
            if k == len(spec.minibatches) - 1:
                engine.drain()  # the run ends when its last step is applied on every owner
            t2 = recorder.now()
            recorder.sample_memory()
            recorder.add("minibatch", t_mb, t2, loss_sum=float(loss_sum))
            if profiler is not None:
                profile.save(profiler, device, profile.folder(config.results_dir, spec.run_id), rank,
                             f"run {spec.run_id}, rank {rank}, minibatch {k}, commit {git_commit()}, device {device}")
                profiler, recorder.profiling = None, False  # its records go with the garbage collected below
            collect_garbage_between_minibatches()
            recorder.add("gc", t2, recorder.now())
            every = config.checkpoint.every
            if every and (k + 1) % every == 0 and k + 1 < len(spec.minibatches):
                t3 = recorder.now()
                save(engine, spec, folder, k + 1, claim_base)
                recorder.add("checkpoint", t3, recorder.now())
            recorder.resolve()
            if rank == 0:
                store.add(MINIBATCHES_DONE, 1)
        recorder.enabled = False
        if job.collect_params:
            params = engine.full_parameters()
            if rank == 0:
                torch.save(params, Path(job.out_dir) / "params.pt")
        result = dict(rank=rank, events=recorder.events, peak_bytes=recorder.peak_bytes, heap_bytes=engine.heap_bytes,
                      resumed_from=start, attention=",".join(sorted(model.attention_kernels)))
        atomic_write_text(Path(job.out_dir) / f"rank{rank}.json", json.dumps(result))
        finished = True
    except Exception as e:
        explained = liveness.explain(e)
        if explained is e:
            raise
        raise explained from e
    finally:
        gc.unfreeze()
        gc.enable()
        recorder.enabled = False
        if engine is not None:
            engine.close()  # also on failure: a heap's segments go, a prefetch thread stops
        liveness.stop(finished)
        if dist.is_initialized():
            dist.destroy_process_group()


def save(engine: DataParallelEngine, spec: RunSpec, folder: Path, next_minibatch: int, claim_base: int) -> None:
    """Checkpoint the run before minibatch `next_minibatch`: the engine's shards, where the run
    stands (its claim counter's base and every rank's RNG state) and the run's config."""
    rng = [None] * dist.get_world_size()
    dist.all_gather_object(rng, torch.get_rng_state())
    checkpoint.save(engine, folder, next_minibatch,
                    {"next_minibatch": next_minibatch, "claim_base": claim_base, "rng": rng,
                     "run_id": spec.run_id, "config": spec.config.to_dict()}, keep=spec.config.checkpoint.keep)


def resume(engine: DataParallelEngine, folder: Path, rank: int, run_id: str) -> tuple[int, int]:
    """(first minibatch to run, claim base): from the newest complete checkpoint in `folder`,
    loaded into the engine, or (0, 0) when there is none."""
    chosen: list[Path | None] = [None]
    if rank == 0:
        with warnings.catch_warnings():  # the launcher named what it skips, once
            warnings.simplefilter("ignore", checkpoint.DamagedCheckpointWarning)
            chosen[0] = checkpoint.latest(folder)
    # Rank 0 chooses for all: on a shared file system another node's view of a file's size can
    # lag (attribute caching), and ranks loading different checkpoints would train on a mix.
    dist.broadcast_object_list(chosen, src=0)
    found = chosen[0]
    if found is None:
        return 0, 0
    extra = checkpoint.load(engine, found)
    if extra.get("run_id") != run_id:
        raise RuntimeError(f"{found} is a checkpoint of run {extra.get('run_id')}, not of this run ({run_id}); "
                           f"move it away or set checkpoint.resume=never")
    if rank < len(extra["rng"]):
        torch.set_rng_state(extra["rng"][rank])
    return int(extra["next_minibatch"]), int(extra["claim_base"])


def collect_garbage_between_minibatches() -> None:
    """Collect now, then keep the collector out of the minibatch that follows.

    Left automatic, Python's full collection (hundreds of thousands of objects in a rank) fell
    inside a unit's forward, at the same place on every rank (they allocate in step), and no
    model of the engines can predict it (measured: docs/simulator.md, validation run 6).
    Collecting between minibatches and freezing what survives (gc.freeze) keeps every pause
    out of the engines' timelines and each collection small: it scans only what the last
    minibatch left, and its cycles are freed before they are frozen.
    """
    gc.disable()
    gc.collect()
    gc.freeze()


def rank_entry(rank: int, job: RankJob) -> None:
    """Entry point of a locally spawned rank (torch.multiprocessing passes the rank first)."""
    # Ctrl-C reaches every process of the terminal's group: the parent alone decides, stops the
    # ranks and removes what they leave (run/local.py), so a rank ignores it rather than dying
    # mid-write with a traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    run_rank(rank, job)
