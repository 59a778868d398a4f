"""The ODC engine through the real worker and launcher: equivalence, decoupling, no collectives."""

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from odc_bench.plan.spec import resolve
from odc_bench.record.metrics import events_frame, minibatch_losses
from odc_bench.run.local import run_local
from odc_bench.run.worker import RankJob, rank_entry
from odc_core.engine.fsdp2 import CollectiveEngine
from odc_core.engine.odc import OdcEngine
from tests.helpers import run_config
from tests.helpers.reference import relative_error, train_single_process

pytestmark = pytest.mark.slow

SMALL = ("model.num_layers=2", "world_size=2", "minibatch_size=2", "warmup_minibatches=0",
         "optim.weight_decay=0.1", "dataset.length_scale=0.005")


def _spec(engine: str, *overrides: str):
    return resolve(run_config(f"engine={engine}", *SMALL, *overrides))


@pytest.fixture(scope="module")
def collective_run() -> tuple:
    """The collective engine's 3-minibatch run, its torch.distributed calls counted (spying_entry,
    below): the baseline both of the equivalence test and of the no-collective check's spy."""
    spec = _spec("collective", "num_minibatches=3")
    return spec, run_local(spec, collect_params=True, entry=spying_entry)


def test_uneven_microbatch_counts_match_fsdp2_and_a_single_process(collective_run):
    odc = _spec("odc", "num_minibatches=3")
    # Rank 1 idles in minibatch 0, rank 0 in minibatch 2; minibatch 1 splits 3 to 1.
    splits = [([0, 1, 2, 3], []), ([0, 1, 2], [3]), ([], [0, 1, 2, 3])]
    odc = replace(odc, minibatches=[replace(mb, plan=[[[i] for i in mine], [[i] for i in theirs]])
                                    for mb, (mine, theirs) in zip(odc.minibatches, splits, strict=True)])
    odc_params = run_local(odc, collect_params=True)[0]["params"]
    collective, results = collective_run
    assert [m.sample_ids for m in collective.minibatches] == [m.sample_ids for m in odc.minibatches]
    collective_params = results[0]["params"]
    reference, _ = train_single_process(odc)
    assert relative_error(odc_params, reference) < 1e-5
    assert relative_error(collective_params, reference) < 1e-5
    assert relative_error(odc_params, collective_params) < 1e-5


def test_loss_curves_of_both_engines_match_over_20_steps():
    losses = {}
    for engine in ("odc", "collective"):
        spec = _spec(engine, "num_minibatches=20", "model.num_layers=1")
        events = events_frame(run_local(spec))
        losses[engine] = minibatch_losses(events, [mb.labelled_tokens for mb in spec.minibatches])
    assert len(losses["odc"]) == 20
    assert losses["odc"][-1] < losses["odc"][0], "training should make progress"
    for a, b in zip(losses["odc"], losses["collective"], strict=True):
        assert a == pytest.approx(b, rel=1e-4)


# Every public communication function of torch.distributed, found by name so the spy keeps
# up with torch (FSDP2 in 2.13 calls all_gather_single / reduce_scatter_single).
COLLECTIVES = sorted(name for name in dir(c10d) if not name.startswith("_") and callable(getattr(c10d, name))
                     and re.search(r"gather|scatter|reduce|broadcast|barrier|all_to_all|send|recv", name)
                     and not name[0].isupper())


def spying_entry(rank: int, job: RankJob) -> None:
    """Count torch.distributed calls made between begin_minibatch() and finish_minibatch()."""
    state = {"inside": False, "inside_calls": 0, "outside_calls": 0}

    def counting(fn):
        def wrapper(*args, **kwargs):
            state["inside_calls" if state["inside"] else "outside_calls"] += 1
            return fn(*args, **kwargs)
        return wrapper

    for name in COLLECTIVES:
        wrapped = counting(getattr(c10d, name))
        setattr(c10d, name, wrapped)
        if hasattr(dist, name):
            setattr(dist, name, wrapped)
    for cls in (OdcEngine, CollectiveEngine):
        begin, finish = cls.begin_minibatch, cls.finish_minibatch

        def begin_wrapped(self, _begin=begin):
            _begin(self)
            state["inside"] = True

        def finish_wrapped(self, _finish=finish):
            state["inside"] = False
            _finish(self)

        cls.begin_minibatch, cls.finish_minibatch = begin_wrapped, finish_wrapped
    rank_entry(rank, job)
    result = Path(job.out_dir) / f"rank{rank}.json"
    result.write_text(json.dumps({**json.loads(result.read_text()), "spy": state}))


@pytest.mark.parametrize(("engine", "overrides"), [("odc", ()), ("odc", ("engine.staleness=1",)),
                                                   ("collective", ())])
def test_no_collective_runs_inside_an_odc_minibatch(engine, overrides, collective_run):
    results = (collective_run[1] if engine == "collective" else
               run_local(_spec(engine, "num_minibatches=3", *overrides), entry=spying_entry))
    inside = [r["spy"]["inside_calls"] for r in results]
    if engine == "odc":
        assert inside == [0, 0]
    else:  # the spy works: FSDP2 communicates inside every minibatch
        assert all(n > 0 for n in inside)


def test_bf16_compute_matches_fsdp2_mixed_precision_and_gathers_half_the_bytes():
    """bf16 compute, fp32 master shards and fp32 accumulation, like FSDP2's policy
    (param_dtype=bf16, reduce_dtype=fp32); ODC gathers the bf16 shadow shards."""
    runs = {}
    for engine, precision in (("odc", "bf16"), ("collective", "bf16"), ("odc", "fp32")):
        spec = _spec(engine, "num_minibatches=2", f"precision={precision}")
        runs[engine, precision] = run_local(spec, collect_params=True)
    odc, collective = runs["odc", "bf16"][0]["params"], runs["collective", "bf16"][0]["params"]
    assert relative_error(odc, collective) < 1e-3
    fp32_heap = runs["odc", "fp32"][0]["heap_bytes"]
    bf16_heap = runs["odc", "bf16"][0]["heap_bytes"]
    # fp32: master + accumulator, 8 bytes per shard element (plus a few flag words); bf16 adds
    # a 2-byte shadow per element, which is what peers gather.
    assert bf16_heap - fp32_heap == pytest.approx(fp32_heap / 4, rel=0.01)


def test_the_learnable_token_source_reaches_the_ranks():
    """dataset.tokens=learnable: the ranks train on the ids the reference trains on (were they the
    synthetic ones, the parameters would part after the first step)."""
    spec = _spec("odc", "num_minibatches=3", "dataset.tokens=learnable")
    reference, losses = train_single_process(spec)
    odc = run_local(spec, collect_params=True)
    assert relative_error(odc[0]["params"], reference) < 1e-5
    run = minibatch_losses(events_frame(odc), [mb.labelled_tokens for mb in spec.minibatches])
    assert run == pytest.approx(losses, rel=1e-5)
