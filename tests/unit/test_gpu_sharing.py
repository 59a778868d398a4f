"""More ranks than GPUs on one host: run/worker.py deals them round robin, so they share GPUs.
An engine that takes a GPU per rank (FSDP2 over NCCL, NVSHMEM, hybrid ODC's replica all-reduce
over NCCL) is refused in one line before any rank starts, where NCCL would fail once every
rank had started; ranks that share a GPU share its memory in the memory check. The GPU is a
stand-in here: the check reads only how many there are and their memory."""

import pytest

from odc_bench.errors import ConfigError
from odc_bench.plan import device
from odc_bench.plan import spec as plan_spec
from tests.helpers import run_config

GiB = 2**30


def _resolve(monkeypatch: pytest.MonkeyPatch, gpus: int, *overrides: str, gpu_gib: float = 80.0) -> plan_spec.RunSpec:
    monkeypatch.setattr(device, "cuda_available", lambda: True)
    monkeypatch.setattr(plan_spec, "visible_gpus", lambda: gpus)
    monkeypatch.setattr(plan_spec, "hardware_tag", lambda device_type: "h100")
    monkeypatch.setattr(plan_spec, "memory_limit", lambda config, device_type: int(gpu_gib * GiB))
    monkeypatch.setattr(plan_spec, "gpus_without_peer_access", lambda count: [])  # each reaches the others
    return plan_spec.resolve(run_config("device=cuda", *overrides))


@pytest.mark.parametrize(("overrides", "why"), [
    (("engine=collective",), "engine=collective runs FSDP2 over NCCL"),
    (("engine=odc", "engine.transport=nvshmem"), "engine.transport=nvshmem maps one process per GPU"),
    (("engine=odc", "engine.shard=hybrid", "engine.ranks_per_node=1"),
     "hybrid sharding reduces its replicas over NCCL"),
])
def test_an_engine_that_takes_a_gpu_per_rank_is_refused_where_ranks_would_share_one(monkeypatch, overrides, why):
    with pytest.raises(ConfigError) as refused:
        _resolve(monkeypatch, 1, "world_size=2", *overrides).check_devices()
    said = str(refused.value)
    assert said.startswith(f"{why}, which takes a GPU per rank: world_size=2 on this host's 1 GPU(s); ")
    assert "\n" not in said
    _resolve(monkeypatch, 2, "world_size=2", *overrides).check_devices()  # a GPU each


def test_odc_on_cuda_ipc_may_share_a_gpu_and_its_ranks_share_its_memory(monkeypatch):
    spec = _resolve(monkeypatch, 1, "world_size=2", "engine=odc")
    assert spec.config.engine.options.transport == "cuda_ipc"
    spec.check_devices()
    need = spec.memory.total / GiB
    # A GPU that holds one rank's estimate but not two.
    shared = _resolve(monkeypatch, 1, "world_size=2", "engine=odc", gpu_gib=1.5 * need)
    with pytest.raises(ConfigError, match=r"over the [\d.]+ GiB it has \(2 ranks share each GPU's [\d.]+ GiB\)"):
        shared.check_fits()
    _resolve(monkeypatch, 2, "world_size=2", "engine=odc", gpu_gib=1.5 * need).check_fits()


def test_cuda_ipc_across_gpus_without_peer_access_is_refused_before_any_rank_starts(monkeypatch):
    asked = []

    def without(pairs):
        return lambda count: asked.append(count) or [p for p in pairs if max(p) < count]

    def check(gpus: int, world: int, engine: str = "odc") -> None:
        spec = _resolve(monkeypatch, gpus, f"world_size={world}", f"engine={engine}")
        monkeypatch.setattr(plan_spec, "gpus_without_peer_access", without([(1, 2)]))
        spec.check_devices()

    with pytest.raises(ConfigError) as refused:
        check(4, 3)
    said = str(refused.value)
    assert said.startswith("engine.transport=cuda_ipc adds into a peer GPU's memory from its own, and GPU 1 has no "
                           "peer access to GPU 2") and "\n" not in said
    assert asked == [3], "the GPUs the ranks get: one each, not the host's every GPU"
    check(2, 4)  # ranks on GPUs 0 and 1, which reach each other
    check(1, 3)  # one GPU, shared: nothing to reach
    check(4, 3, "collective")  # NCCL finds its own path
    assert asked == [3, 2]
