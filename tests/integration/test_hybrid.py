"""Hybrid sharding (engine.shard=hybrid) in both real engines, on nodes emulated on one host:
4 ranks as 2 nodes of 2 (engine.ranks_per_node=2)."""

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from odc_bench.plan.spec import resolve
from odc_bench.run.local import run_local
from odc_bench.run.worker import RankJob, rank_entry
from odc_core.engine.fsdp2 import CollectiveEngine
from odc_core.engine.odc import OdcEngine
from odc_core.transport.shm import ShmHeap
from tests.helpers import run_config
from tests.helpers.reference import relative_error, train_single_process

pytestmark = pytest.mark.slow

HYBRID = ("model.num_layers=2", "world_size=4", "minibatch_size=1", "warmup_minibatches=0", "num_minibatches=3",
          "optim.weight_decay=0.1", "dataset.length_scale=0.005", "engine.shard=hybrid", "engine.ranks_per_node=2")


def _spec(engine: str, *overrides: str):
    return resolve(run_config(f"engine={engine}", *HYBRID, *overrides))


def spying_entry(rank: int, job: RankJob) -> None:
    """Record which heap ranks this rank reads from, and a digest of the parameters it sees at
    the end (gathered from its own node's owners: its node's replica)."""
    peers: set[int] = set()
    digests: list[str] = []
    get, full_parameters = ShmHeap.get, OdcEngine.full_parameters

    def counting_get(self, out, name, peer, offset=0):
        if name.startswith("odc/"):  # the engine's buffers, not a shm process group's
            peers.add(peer)
        return get(self, out, name, peer, offset)

    def digesting(self):
        params = full_parameters(self)
        h = hashlib.sha256()
        for name in sorted(params):
            h.update(params[name].numpy().tobytes())
        digests.append(h.hexdigest())
        return params

    ShmHeap.get, OdcEngine.full_parameters = counting_get, digesting
    rank_entry(rank, job)
    result = Path(job.out_dir) / f"rank{rank}.json"
    result.write_text(json.dumps({**json.loads(result.read_text()), "peers": sorted(peers), "digests": digests}))


def test_odc_hybrid_matches_a_single_process_and_reads_only_its_node():
    spec = _spec("odc")
    # Minibatch 0: node 1 (ranks 2, 3) has no work at all; 1: one microbatch each; 2: ranks 0
    # and 3 idle, rank 1 takes three.
    splits = [[[0, 1], [2, 3], [], []], [[0], [1], [2], [3]], [[], [0, 1, 2], [3], []]]
    spec = replace(spec, minibatches=[replace(mb, plan=[[[i] for i in mine] for mine in split])
                                      for mb, split in zip(spec.minibatches, splits, strict=True)])
    results = run_local(spec, collect_params=True, entry=spying_entry)
    reference, _ = train_single_process(spec)
    assert relative_error(results[0]["params"], reference) < 1e-5
    nodes = {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]}
    assert [r["peers"] for r in results] == [nodes[rank] for rank in range(4)]
    # Both nodes' replicas hold the same parameters, bit for bit.
    digests = {d for r in results for d in r["digests"]}
    assert len(digests) == 1 and all(r["digests"] for r in results)


def mesh_entry(rank: int, job: RankJob) -> None:
    """Record the device mesh FSDP2 sharded the parameters over."""
    meshes: list[dict] = []
    full_parameters = CollectiveEngine.full_parameters

    def recording(self):
        mesh = next(self.model.parameters()).device_mesh
        # The roles of its dimensions (the engine suffixes each name with its job id).
        meshes.append({"shape": list(mesh.shape), "names": [n.split(".")[0] for n in mesh.mesh_dim_names or ()]})
        return full_parameters(self)

    CollectiveEngine.full_parameters = recording
    rank_entry(rank, job)
    result = Path(job.out_dir) / f"rank{rank}.json"
    result.write_text(json.dumps({**json.loads(result.read_text()), "meshes": meshes}))


@pytest.mark.parametrize("backend", ["shm", "gloo"])
def test_fsdp2_hsdp_matches_a_single_process(backend):
    spec = _spec("collective", f"engine.backend={backend}")
    results = run_local(spec, collect_params=True, entry=mesh_entry)
    assert [r["meshes"] for r in results] == [[{"shape": [2, 2], "names": ["replicate", "shard"]}]] * 4
    reference, _ = train_single_process(spec)
    assert relative_error(results[0]["params"], reference) < 1e-5
