"""What the GPU transports do that is not CUDA, checked on CPU: the handle exchange through the
store, the accumulate kernel's argument checks and its sums (Triton's CPU interpreter), and the
one-line refusals where CUDA is absent, which peers NVSHMEM maps, the sweep of torch's CUDA
IPC reference-count files, the one-op gather and one-launch scatter of a heap that maps its
peers (over CPU tensors), and the kernels compiled for an H100 without one.
Their CUDA parts run in tests/integration/test_transport_conformance.py and test_gpu_odc.py."""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import threading

import pytest
import torch
import torch.distributed as dist

from odc_core.primitives import ShardLayout, gather, scatter_accumulate
from odc_core.transport.atomic_add import SpansAdd, atomic_add_
from odc_core.transport.base import PeerTimeout
from odc_core.transport.cuda_ipc import enable_peer_access, sweep_ipc_counters
from odc_core.transport.exchange import exchange, rotated
from odc_core.transport.mapped import MappedGather, SpanOps
from odc_core.transport.nvshmem import peer_views
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [1, 4095, 4096, 3 * 4096 + 5])
def test_the_accumulate_kernel_sums_every_push_under_tritons_interpreter(monkeypatch, dtype, n):
    """The Triton kernel itself (not a stand-in), run by Triton's CPU interpreter: three pushes
    into a shard that sits at an offset inside a larger buffer, as a peer's mapped shard does,
    sum exactly (small integers are exact in every float type), at sizes that end inside a
    block, on one, and past it; nothing outside the shard moves."""
    pytest.importorskip("triton", reason="Triton is not installed (the dev extra installs it on Linux x86_64)")
    from odc_core.transport import atomic_add

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    # A kernel built under the interpreter, for this test only (the module's own stays as it was).
    monkeypatch.setattr(atomic_add, "_kernel", functools.cache(atomic_add._kernel.__wrapped__))
    buffer = torch.full((n + 9,), -1.0)
    shard = buffer[4:4 + n]
    pushes = [torch.arange(n).remainder(7).to(dtype) * (peer + 1) for peer in range(3)]
    for push in pushes:
        atomic_add_(shard, push)
    want = sum(p.float() for p in pushes) - 1.0
    assert torch.equal(shard, want)
    assert torch.equal(buffer[:4], torch.full((4,), -1.0)) and torch.equal(buffer[4 + n:], torch.full((5,), -1.0))


def test_nvshmem_gives_no_view_of_a_peer_whose_address_is_null():
    class Rendezvous:  # torch's NVSHMEM handle: rank 2 over the network, so nvshmem_ptr gave 0
        buffer_ptrs = [0x7F00, 0x8F00, 0]

        def get_buffer(self, peer, sizes, dtype):
            return torch.full(sizes, float(peer), dtype=dtype)

    own = torch.zeros(3, dtype=torch.bfloat16)
    views = peer_views(Rendezvous(), 0, own)
    assert views[0] is own and views[2] is None
    assert views[1].dtype == torch.bfloat16 and views[1].tolist() == [1.0] * 3


def test_a_rank_gets_peer_access_to_each_other_gpu_once_and_gpus_without_it_are_refused(monkeypatch):
    # A peer's buffer is mapped on the peer's GPU; the atomic adds run on the rank's own, so that
    # GPU must reach the peer's: torch enables it for a copy's source GPU to its destination's.
    enable_peer_access.cache_clear()
    asked, copies = [], []

    class Tensor:
        def __init__(self, *_, device):
            self.device = device

        def copy_(self, src):
            copies.append((src.device.index, self.device.index))

    monkeypatch.setattr(torch, "empty", Tensor)
    monkeypatch.setattr(torch.cuda, "can_device_access_peer", lambda d, p: asked.append((d.index, p.index)) or True)
    gpu = [torch.device("cuda", i) for i in range(3)]
    for peer in (gpu[0], gpu[1], gpu[1], gpu[2]):  # its own GPU (ranks sharing it), then two others
        enable_peer_access(gpu[0], peer)
    assert asked == [(0, 1), (0, 2)] and copies == [(0, 1), (0, 2)], "from the rank's GPU to each peer's, once"
    monkeypatch.setattr(torch.cuda, "can_device_access_peer", lambda d, p: False)
    with pytest.raises(RuntimeError, match="GPU 1 has no peer access to GPU 2") as refused:
        enable_peer_access(gpu[1], gpu[2])
    assert "\n" not in str(refused.value)
    enable_peer_access.cache_clear()


def test_ipc_counters_are_swept_only_for_processes_of_this_host_that_are_gone(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()
    host = socket.gethostname()
    for pid in (gone.pid, os.getpid()):
        (tmp_path / f"torch_{pid}_7_0").touch()
        (tmp_path / f"torch_{pid}1_7_0").touch()  # another pid that starts with the same digits
    assert sweep_ipc_counters([(host, gone.pid), (host, os.getpid())], tmp_path) == [f"torch_{gone.pid}_7_0"]
    (tmp_path / f"torch_{gone.pid}_8_0").touch()
    assert sweep_ipc_counters([("another-host", gone.pid)], tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"torch_{gone.pid}1_7_0", f"torch_{os.getpid()}_7_0", f"torch_{os.getpid()}1_7_0", f"torch_{gone.pid}_8_0"])


class _MappedHost:
    """A mapped heap (cuda_ipc, nvshmem) as far as it gathers and scatters, over CPU tensors: every
    rank's buffer is a tensor here, as a peer's GPU memory is one in a CUDA process; its whole
    gathers and scatters are the heaps' own (mapped.py's SpanOps)."""

    def __init__(self, rank: int, buffers: dict[str, list[torch.Tensor]]) -> None:
        self.rank, self.world_size = rank, len(next(iter(buffers.values())))
        ops = SpanOps(lambda name, owner, offset, numel: buffers[name][owner][offset:offset + numel],
                      torch.device("cpu"))
        self.get, self.get_spans, self.accumulate_spans = ops.get, ops.get_spans, ops.accumulate_spans


@pytest.mark.parametrize("world,owners", [(1, None), (2, None), (3, None), (4, (1, 3)), (4, (0, 1, 2))])
@pytest.mark.parametrize("numel", [1, 5, 1000, 3 * 4000 + 2])
@pytest.mark.parametrize("padded", [False, True])
def test_a_mapped_gather_is_one_op_and_equals_the_owners_shards(monkeypatch, world, owners, numel, padded):
    group = owners or tuple(range(world))
    layout = ShardLayout(numel, len(group))
    whole = torch.randn(layout.padded_numel)
    buffers = [torch.full((layout.shard_numel,), float("nan")) for _ in range(world)]  # not an owner: never read
    for i, owner in enumerate(group):
        buffers[owner] = whole[i * layout.shard_numel:(i + 1) * layout.shard_numel].clone()
    cats = []
    real_cat = torch.cat
    monkeypatch.setattr(torch, "cat", lambda *a, **k: cats.append(1) or real_cat(*a, **k))
    heaps = [_MappedHost(rank, {"p": buffers}) for rank in range(world)]
    for step in range(2):  # the second gather reuses the first's plan: views, which see new values
        for heap in heaps:  # every rank, owners' and others' (hybrid sharding's replicas)
            out = torch.zeros(layout.padded_numel if padded else numel)
            gather(heap, "p", out, layout, owners)
            assert torch.equal(out, whole[:out.numel()] + step), (heap.rank, world, owners)
        for owner in group:
            buffers[owner] += 1
    assert len(cats) == 2 * world, "one concatenation per gather, whatever the number of owners"


def test_a_mapped_get_copies_a_peers_range_into_any_shape_and_refuses_another_dtype():
    buffers = {"p": [torch.arange(6.0), torch.arange(6.0) + 10]}
    heap = _MappedHost(0, buffers)
    out = torch.zeros(2, 2)
    heap.get(out, "p", 1, offset=2)
    assert out.tolist() == [[12.0, 13.0], [14.0, 15.0]]
    with pytest.raises(TypeError, match=r"get of 'p' \(torch.float32\) into a torch.bfloat16 tensor"):
        heap.get(torch.zeros(2, dtype=torch.bfloat16), "p", 0)


def test_a_mapped_gather_copies_shard_by_shard_where_one_op_cannot_and_checks_its_output():
    buffers = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])]
    plan = MappedGather.of(((1, 4, 6), (0, 0, 2)), lambda owner, numel: buffers[owner][:numel])
    out = torch.zeros(6)
    plan.run(out)  # spans that leave a gap are not one concatenation
    assert out.tolist() == [1.0, 2.0, 0.0, 0.0, 3.0, 4.0]
    tiled = MappedGather.of(((0, 0, 2), (1, 2, 4)), lambda owner, numel: buffers[owner][:numel])
    assert tiled.one_op(torch.empty(4)) and not tiled.one_op(torch.empty(4, device="meta")), \
        "a source on another device than the output (another GPU, the host) is copied on its own"
    with pytest.raises(TypeError, match="dtypes must match"):
        tiled.run(torch.empty(4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="up to 4; the output has 3"):
        tiled.run(torch.empty(3))


@pytest.fixture
def interpreted(monkeypatch):
    """Triton's CPU interpreter for the one-launch scatter's kernel, for this test only (the
    module's own stays as it was); the launches it makes, by grid."""
    pytest.importorskip("triton", reason="Triton is not installed (the dev extra installs it on Linux x86_64)")
    from odc_core.transport import atomic_add

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kernel, launches = functools.cache(atomic_add._spans_kernel.__wrapped__), []

    class Counted:  # the kernel, its launches counted
        def __getitem__(self, grid):
            launches.append(grid)
            return kernel()[grid]

    monkeypatch.setattr(atomic_add, "_spans_kernel", Counted)
    return launches


@pytest.mark.parametrize("world,owners", [(1, None), (3, None), (4, (2, 0))])
@pytest.mark.parametrize("numel", [1, 4095, 2 * 4096 + 3, 3 * 4096 * 3 + 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_mapped_scatter_is_one_launch_and_every_push_lands_in_its_owners_shard(interpreted, world, owners, numel,
                                                                                 dtype):
    """The fused kernel itself, under Triton's interpreter: every rank pushes its whole gradient
    (bf16 ones into fp32 accumulators too), each owner's accumulator ends as the sum of its slice
    over ranks (small integers: exact in every float type), and nothing outside a shard moves."""
    group = owners or tuple(range(world))
    layout = ShardLayout(numel, len(group))
    # Each accumulator sits inside a larger buffer, as a peer's mapped shard may, fenced by -1.
    fenced = [torch.full((layout.shard_numel + 8,), -1.0) for _ in range(world)]
    for f in fenced:
        f[4:4 + layout.shard_numel] = 0.0
    heaps = [_MappedHost(rank, {"g": [f[4:4 + layout.shard_numel] for f in fenced]}) for rank in range(world)]
    grads = [(torch.arange(numel).remainder(5) + rank).to(dtype) for rank in range(world)]
    for heap, grad in zip(heaps, grads, strict=True):
        scatter_accumulate(heap, "g", grad, layout, owners)
    total = torch.zeros(layout.padded_numel)
    total[:numel] = sum(g.float() for g in grads)
    for rank, f in enumerate(fenced):
        i = group.index(rank) if rank in group else None
        want = total[i * layout.shard_numel:(i + 1) * layout.shard_numel] if i is not None else 0.0
        assert torch.equal(f[4:4 + layout.shard_numel], torch.zeros(layout.shard_numel) + want), rank
        assert torch.equal(f[:4], torch.full((4,), -1.0)) and torch.equal(f[-4:], torch.full((4,), -1.0))
    assert len(interpreted) == world, "one kernel launch per scatter, whatever the number of owners"


@pytest.mark.usefixtures("interpreted")
def test_a_mapped_scatter_checks_its_destinations_and_its_source():
    with pytest.raises(TypeError, match="fp32 destination"):
        SpansAdd.of(((0, 0, 4),), lambda owner, numel: torch.zeros(numel, dtype=torch.bfloat16), torch.device("cpu"))
    with pytest.raises(ValueError, match="contiguous destination"):
        SpansAdd.of(((0, 0, 4),), lambda owner, numel: torch.zeros(numel, 2)[:, 0], torch.device("cpu"))
    plan = SpansAdd.of(((1, 3, 6), (0, 0, 3)), lambda owner, numel: torch.zeros(numel), torch.device("cpu"))
    with pytest.raises(ValueError, match="up to 6; the source has 5"):
        plan.run(torch.ones(5))


@pytest.mark.parametrize("src", ["*fp32", "*bf16"])
@pytest.mark.parametrize("kernel,signature,constexprs", [
    ("_kernel", {"dst": "*fp32", "n": "i32"}, {}),
    ("_spans_kernel", {"addresses": "*i64", "starts": "*i64", "lengths": "*i64", "first_blocks": "*i64"},
     {"SEGMENTS": 3}),
])
def test_the_accumulate_kernels_compile_for_an_h100_on_this_machine(kernel, signature, constexprs, src):
    """Triton compiles each kernel to a cubin for sm_90 (H100, H200) without a GPU: a type error
    in a kernel shows here, not in the few minutes of a lent GPU machine."""
    pytest.importorskip("triton", reason="Triton is not installed (the dev extra installs it on Linux x86_64)")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from odc_core.transport import atomic_add

    fn = getattr(atomic_add, kernel)()
    constexprs = {**constexprs, "BLOCK": 4096}
    params = {**signature, "src": src, **dict.fromkeys(constexprs, "constexpr")}
    ordered = {name: params[name] for name in fn.arg_names}
    compiled = triton.compile(ASTSource(fn=fn, signature=ordered, constexprs=constexprs),
                              target=GPUTarget("cuda", 90, 32))
    ptx = compiled.asm["ptx"]
    assert ("atom." in ptx or "red." in ptx) and compiled.asm["cubin"], "atomic adds, assembled for sm_90"
