"""What the GPU transports do that is not CUDA, checked on CPU: the handle exchange through the
store, the accumulate kernel's argument checks, and the one-line refusals where CUDA is absent.
Their CUDA parts run in tests/integration/test_transport_conformance.py and test_gpu_odc.py."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist

from odc_core.transport.atomic_add import atomic_add_
from odc_core.transport.base import PeerTimeout
from odc_core.transport.exchange import exchange, rotated
from odc_core.transport.registry import AUTO_ORDER, TRANSPORTS, transport_for


def test_exchange_returns_every_peers_value_in_rotated_order():
    store = dist.HashStore()
    world, out = 4, {}

    def rank(r: int) -> None:
        out[r] = exchange(store, "k", r, world, f"v{r}", "a test", 10.0)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in range(world):
        assert out[r] == [(p, f"v{p}") for p in rotated(r, world)[:-1]]
    assert rotated(2, 4) == [3, 0, 1, 2]


def test_exchange_names_the_peer_that_never_published():
    store = dist.HashStore()
    store.set("k/1", "here")
    with pytest.raises(PeerTimeout, match="rank 2: allocation of 'x'") as missed:
        exchange(store, "k", 0, 3, "v0", "allocation of 'x'", 0.2)
    assert missed.value.peer == 2


def test_auto_picks_cuda_ipc_on_gpus_and_nvshmem_is_asked_for_by_name():
    assert transport_for("auto", "cuda").name == "cuda_ipc" and "nvshmem" not in AUTO_ORDER
    assert not TRANSPORTS["cuda_ipc"].spans_hosts and TRANSPORTS["nvshmem"].spans_hosts


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize(("module", "cls"), [("cuda_ipc", "CudaIpcHeap"), ("nvshmem", "NvshmemHeap")])
def test_a_gpu_heap_without_cuda_is_refused_in_one_line(module, cls):
    heap_class = getattr(__import__(f"odc_core.transport.{module}", fromlist=[cls]), cls)
    with pytest.raises(RuntimeError) as refused:
        heap_class(0, 1, "job", dist.HashStore(), 1.0)
    line = str(refused.value)
    assert "\n" not in line and f"transport {module} holds CUDA tensors" in line and "engine.transport=auto" in line


@pytest.mark.parametrize(("dst", "src", "error"), [
    (torch.zeros(4, dtype=torch.bfloat16), torch.ones(4), "fp32 destination"),
    (torch.zeros(4), torch.ones(5), "4 elements, source 5"),
    (torch.zeros(4, 2).t(), torch.ones(8), "contiguous destination"),
])
def test_atomic_accumulation_checks_its_arguments_before_any_kernel(dst, src, error):
    with pytest.raises((TypeError, ValueError), match=error):
        atomic_add_(dst, src)
