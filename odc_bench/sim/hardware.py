"""Hardware profiles: how long a unit computes and how long ranks take to exchange it.

Two kinds of profile give the timelines the same `EngineCosts`:

- `gpu`: compute from the FLOPs model (models/flops.py) at a stated share of the device's
  peak, communication from link bandwidth and latency, running beside compute (CUDA streams);
- `calibrated`: this machine's CPU ranks, fitted from real traces by `odc_bench.calibrate.cpu_profile`
  (per-unit compute as a function of document lengths, and the measured per-position gaps
  that gloo collectives, hooks and copies add in line with compute).

Every number of the GPU profiles and its source is in docs/simulator.md.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import yaml

from odc_bench.config.backend import GpuHardwareConfig, HardwareConfig, Recompute
from odc_bench.config.compose import CONF_DIR
from odc_bench.config.fields import build
from odc_bench.config.model import ModelConfig
from odc_bench.config.run import RunConfig
from odc_bench.errors import ConfigError
from odc_bench.forked import cpu_share
from odc_bench.models.flops import layer_linear_params
from odc_bench.provenance import host_fingerprint
from odc_bench.sim.layout import KINDS, PHASES, Layout
from odc_bench.sim.unit_fit import table_rows

GB = 1e9
# Gap classes of a calibrated profile: the serial time before each kind of position, then
# after the last one (the untraced embedding backward, final reduce-scatters, hooks).
GAP_CLASSES = ("fwd_embed", "fwd_layer", "fwd_head", "bwd_head", "bwd_layer", "tail")
ENGINE_KEYS = (*GAP_CLASSES, "prep", "sync", "optimizer_per_param")


@dataclass(frozen=True)
class Network:
    """Point-to-point transfers of one unit between a rank and the shards' owners.

    A unit of `nbytes` is sharded evenly over `world` ranks, `gpus_per_node` to a node (with
    hybrid sharding `world` is one node's ranks: its shard group). A transfer moves one shard
    between this rank and every other owner. Its time is the largest load over the resources
    it crosses, each shared evenly by the ranks active at that moment: this rank's link, the
    busiest owner's link, this rank's NIC and the busiest remote NIC. A node has `rails` NICs
    of nic_Bps / rails each; a rank's traffic across nodes leaves through its rail's NIC (local
    index mod rails), shared with the other active ranks of its node on that rail.
    """

    world: int
    gpus_per_node: int
    link_Bps: float
    nic_Bps: float
    latency_s: float
    rails: int = 1

    @property
    def nodes(self) -> int:
        return self.world // self.gpus_per_node

    def node_of(self) -> np.ndarray:
        return np.arange(self.world) // self.gpus_per_node

    def transfer_time(self, nbytes: float | np.ndarray, k_loc: np.ndarray, k_tot: np.ndarray,
                      k_min_remote: np.ndarray, k_rail: np.ndarray | None = None,
                      from_peer: float | np.ndarray = 0.0) -> np.ndarray:
        """Seconds for one rank's transfer with k_loc active ranks in its node (itself included),
        k_rail of them on its rail, k_tot active in all, and k_min_remote active in the least
        busy other node.

        `from_peer` bytes of the transfer (a gather's) take their remote shards from a rank of
        this node that holds the whole unit: through this rank's link instead of the NICs.
        """
        if self.world == 1:
            return np.zeros(np.shape(k_loc))
        if np.ndim(from_peer):  # a different amount per rank: each amount in turn
            peer = np.broadcast_to(from_peer, np.shape(k_loc))
            out = np.empty(np.shape(k_loc))
            for amount in np.unique(peer):
                at = peer == amount
                out[at] = self.transfer_time(nbytes, k_loc[at], k_tot[at], k_min_remote[at],
                                             None if k_rail is None else k_rail[at], float(amount))
            return out
        link, nic, remote = self._times(float(nbytes), float(from_peer))
        k_loc = np.asarray(k_loc, dtype=np.intp)
        t = link[k_loc]
        if nic is not None and remote is not None:
            k_nic = k_loc if self.rails == 1 or k_rail is None else np.asarray(k_rail, dtype=np.intp)
            busy_remote = np.asarray(k_tot, dtype=np.intp) - np.asarray(k_min_remote, dtype=np.intp)
            t = np.maximum(t, np.maximum(nic[k_nic], remote[busy_remote + self.gpus_per_node]))
        return self.latency_s + t

    def remote_sets_time(self, nbytes: float, k_loc: np.ndarray, k_tot: np.ndarray, k_min_remote: np.ndarray,
                         k_rail: np.ndarray | None = None, from_peer: float = 0.0) -> np.ndarray:
        """Where the busiest remote NIC's term is above both the rank's link and NIC terms, so
        that fewer ranks active elsewhere would shorten the transfer (transfer_time's counts)."""
        link, nic, remote = self._times(float(nbytes), float(from_peer))
        if self.world == 1 or nic is None or remote is None:
            return np.zeros(np.shape(k_loc), dtype=bool)
        k_loc = np.asarray(k_loc, dtype=np.intp)
        k_nic = k_loc if self.rails == 1 or k_rail is None else np.asarray(k_rail, dtype=np.intp)
        busy_remote = np.asarray(k_tot, dtype=np.intp) - np.asarray(k_min_remote, dtype=np.intp)
        return remote[busy_remote + self.gpus_per_node] > np.maximum(link[k_loc], nic[k_nic])

    def _times(self, nbytes: float, from_peer: float) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """transfer_time's terms for every count a node can have (the counts are small integers, so
        a transfer reads them off): the larger of the rank's own link and the busiest owner's, by
        the node's active ranks (0..g); the rank's NIC, by its node's (or rail's) active ranks;
        the busiest remote NIC, by active ranks elsewhere minus the least busy node's (-g..n).
        None where the ranks share one node."""
        n, g = self.world, self.gpus_per_node
        share = np.asarray(nbytes, dtype=float) / n
        own_link = (g - 1) * share / self.link_Bps
        # The busiest other owner in the node: an idle one serves every active rank, a busy
        # one all but itself.
        k = np.arange(g + 1)
        served = np.where(k < g, k, k - 1) if g > 1 else np.zeros_like(k)
        owner_link = served * share / self.link_Bps
        if from_peer:
            own_link = own_link + (n - g) * (from_peer / n) / self.link_Bps
            share = share - from_peer / n
        link = np.maximum(own_link, owner_link)
        if n <= g:
            return link, None, None
        own_nic = k * (n - g) * share * self.rails / self.nic_Bps
        remote_nic = np.arange(-g, n + 1) * g * share / self.nic_Bps
        return link, own_nic, remote_nic


@dataclass(frozen=True)
class EngineCosts:
    """What an engine's timeline needs besides compute, per microbatch position.

    pre + pre_tok x tokens: serial seconds before each position's compute (overheads; on CPU
    also communication), tokens being the microbatch's (collective: the most over ranks);
    tail + tail_tok x tokens, prep: serial seconds after a microbatch's last position / before
    its first;
    ag/rs: collective all-gather before, reduce-scatter after each position (seconds), running
    beside compute; zero on CPU, where they are part of `pre`;
    ar: collective with hybrid sharding: the all-reduce across nodes after each position's
    reduce-scatter (seconds), on a channel of its own (another process group);
    gather_load/push_load: bytes an ODC gather before / push after each position moves through
    `network`, beside compute (none on CPU); gather_bytes: the gather's own part of
    gather_load (in backward the load also counts the pushes crossing the same links), which
    topology-aware fetch (`fetch_nearest`) may take from a rank of the node instead;
    sync_s: after the minibatch's barrier, before the optimizer (ODC with hybrid sharding: the
    gradient all-reduce across nodes).
    """

    pre: np.ndarray
    pre_tok: np.ndarray
    tail: float
    tail_tok: float
    prep: float
    ag: np.ndarray
    rs: np.ndarray
    gather_load: np.ndarray
    push_load: np.ndarray
    sync_s: float
    optimizer_s: float
    barrier_s: float
    network: Network | None = None
    ar: np.ndarray | None = None
    gather_bytes: np.ndarray | None = None
    fetch_nearest: bool = False


def ring_time(nbytes: np.ndarray, n: int, bus_Bps: float, base_s: float, step_s: float) -> np.ndarray:
    """A ring all-gather or reduce-scatter: (n-1)/n of the bytes through the bus, n-1 hops."""
    if n == 1:
        return np.zeros_like(nbytes)
    return base_s + (n - 1) * step_s + (n - 1) / n * nbytes / bus_Bps


def allreduce_time(nbytes: np.ndarray | float, n: int, bus_Bps: float, base_s: float, step_s: float
                   ) -> np.ndarray:
    """A ring all-reduce (a reduce-scatter, then an all-gather): 2(n-1)/n of the bytes, 2(n-1) hops."""
    nbytes = np.asarray(nbytes, dtype=float)
    if n == 1:
        return np.zeros_like(nbytes)
    return base_s + 2 * (n - 1) * step_s + 2 * (n - 1) / n * nbytes / bus_Bps


@dataclass(frozen=True)
class GpuProfile:
    """A GPU from its published figures (config/backend.py checks every number's range)."""

    hw: GpuHardwareConfig

    @property
    def knots(self) -> tuple[float, ...]:
        """No knots: the FLOPs model is exactly quadratic in document lengths."""
        return ()

    def check_ranks(self, config: RunConfig, world: int) -> None:
        """A GPU profile's ranks are its own: the run's CPU settings are no part of it."""

    def compute_table(self, layout: Layout, recompute: Recompute) -> np.ndarray:
        """Seconds per (kind, phase) as c0 + c_tok * tokens + c_sq * sum(doc_len^2): shape (6, 3)
        (layout.doc_features without knots). With a compute calibration, the units it measured
        come from it (sim/unit_fit.py), the others from the datasheet as follows.

        Backward is twice the forward's FLOPs, plus what checkpointing recomputes of the
        forward (layers only: checkpointing wraps the decoder layers): its share of the matrix
        multiplies (the tokens term) and of attention (the squared-lengths term). The embedding
        is memory-bound: a gather of rows forward, zeroing and scattering into the table's
        gradient backward.
        """
        measured: dict[tuple[str, str], np.ndarray] = {}
        if self.hw.compute_calibration:
            calibration = _load_json(self.hw)
            if "units" not in calibration:  # a whole-microbatch fit: every unit from it
                return split_microbatch_fit(calibration, layout, recompute)
            measured = table_rows(calibration["units"], layout.cfg, recompute)
        cfg = layout.cfg
        mm = self.hw.peak_tflops * 1e12 * self.hw.matmul_efficiency
        attn = self.hw.peak_tflops * 1e12 * self.hw.attention_efficiency
        mem = self.hw.hbm_gbps * GB * self.hw.memory_efficiency
        c0 = self.hw.unit_overhead_s
        h, v = cfg.hidden_size, cfg.vocab_size
        layer_tok, layer_sq = 2.0 * layer_linear_params(cfg) / mm, 2.0 * cfg.attention_width / attn
        # A document of s tokens at efficiency E s / (s + half): its FLOPs' time is (s^2 + half s) / E.
        attn_tok = layer_sq * self.hw.attention_half_length
        head_tok = 2.0 * h * v / mm
        table = {
            ("embed", "fwd"): (c0, 2 * h * 2 / mem, 0.0),
            ("embed", "bwd"): (c0 + v * h * 4 / mem, 2 * h * 4 / mem, 0.0),
            ("layer", "fwd"): (c0, layer_tok + attn_tok, layer_sq),
            ("layer", "bwd"): (c0, (2.0 + recompute.matmul) * layer_tok + (2.0 + recompute.attention) * attn_tok,
                               (2.0 + recompute.attention) * layer_sq),
            ("head", "fwd"): (c0, head_tok, 0.0),
            ("head", "bwd"): (c0, 2 * head_tok, 0.0),
        }
        # Measured units (sim/unit_fit.py) replace the datasheet's; units not measured keep it.
        return np.array([measured.get((k, p), table[(k, p)]) for k in KINDS for p in PHASES])

    def network(self, world: int) -> Network:
        g = min(self.hw.gpus_per_node, world)
        if world % g:
            raise ConfigError(f"world_size {world} does not fill whole nodes of {self.hw.gpus_per_node} GPUs; "
                              f"use a multiple of {self.hw.gpus_per_node}")
        return Network(world, g, self.hw.link_gbps * GB * self.hw.link_efficiency,
                       self.hw.nic_gbps * GB * self.hw.nic_efficiency, self.hw.p2p_latency_s,
                       rails=min(self.hw.nic_rails, g))

    def engine_costs(self, engine: str, layout: Layout, world: int, precision: str,
                     odc_gather_bytes: int, shard: str = "full", fetch: str = "owner",
                     internode_slowdown: float = 1.0) -> EngineCosts:
        """Communication of the engine's timeline. With hybrid sharding a unit is sharded over
        the ranks of one node (`group`): gathers, pushes, all-gathers and reduce-scatters stay
        inside it, and the replicas in the other nodes reduce their gradients across nodes:
        FSDP2 (HSDP) all-reduces each unit's gradient shard after every reduce-scatter, ODC
        all-reduces its whole accumulated shard once per minibatch, after the barrier.
        `internode_slowdown`: ODC's point-to-point transfers across nodes get the NICs'
        bandwidth divided by it (the reference transport's, backend.odc_internode_slowdown)."""
        net = self.network(world)
        # Measured (make gpu-check): the device's idle time per unit position that an engine's
        # host work adds in line with compute (FSDP2's per-unit bookkeeping on one rank).
        gaps = _load_json(self.hw).get("engine_gaps", {}) if self.hw.compute_calibration else {}
        gap = np.full(layout.positions, float(gaps.get(engine, 0.0)))
        hybrid = shard == "hybrid" and net.nodes > 1
        group = net.gpus_per_node if hybrid else world
        if hybrid:  # the shard group: one node, its ranks as many as the node has
            net = Network(group, group, net.link_Bps, net.nic_Bps, net.latency_s)
        params = layout.unit_params[layout.position_unit]
        bwd = layout.position_phase == 1
        zeros = np.zeros(layout.positions)
        bus = net.link_Bps if group <= net.gpus_per_node else net.nic_Bps
        param_bytes = 2 if precision == "bf16" else 4
        optimizer_s = self.hw.optimizer_overhead_s + float(layout.unit_params.sum()) / group * ADAMW_BYTES / (
            self.hw.hbm_gbps * GB * self.hw.memory_efficiency)
        barrier_s = self.hw.barrier_s if world > 1 else 0.0
        latency, step = self.hw.collective_latency_s, self.hw.ring_step_s
        nodes = world // group
        # Across nodes each rank reduces with its replicas (the ranks of its local index), all of
        # a node's ranks at once: each gets 1/group of the node's NIC bandwidth (the same with
        # rails: a rail's NIC serves its share of the node's ranks).
        replica_Bps = self.hw.nic_gbps * GB * self.hw.nic_efficiency / group
        if engine == "collective":
            ag = ring_time(params * param_bytes, group, bus, latency, step)
            rs = np.where(bwd, ring_time(params * 4, group, bus, latency, step), 0.0)
            ar = np.where(bwd, allreduce_time(params * 4 / group, nodes, replica_Bps, latency, step), 0.0)
            return EngineCosts(pre=gap, pre_tok=zeros, tail=0.0, tail_tok=0.0, prep=0.0, ag=ag, rs=rs,
                               gather_load=zeros, push_load=zeros, sync_s=0.0, optimizer_s=optimizer_s,
                               barrier_s=barrier_s, ar=ar if hybrid else None)
        net = replace(net, nic_Bps=net.nic_Bps / internode_slowdown)
        gather = params * odc_gather_bytes
        push = np.where(bwd, params * 4, 0.0)
        owned = float(layout.unit_params.sum()) / group * 4
        sync_s = float(allreduce_time(owned, nodes, replica_Bps, latency, step)) if hybrid else 0.0
        # In backward a rank's gathers and pushes, and its peers' into its shard, cross the same
        # links at the same time: both see the two loads together.
        return EngineCosts(pre=gap, pre_tok=zeros, tail=0.0, tail_tok=0.0, prep=0.0, ag=zeros, rs=zeros,
                           gather_load=np.where(bwd, gather + push, gather),
                           push_load=np.where(bwd, gather + push, 0.0), sync_s=sync_s, optimizer_s=optimizer_s,
                           barrier_s=barrier_s, network=net, gather_bytes=gather,
                           fetch_nearest=fetch == "nearest" and not hybrid and net.nodes > 1)


def _load_json(hw: GpuHardwareConfig) -> dict:
    p = hw.compute_calibration_file()
    assert p is not None
    try:
        return json.loads(p.read_text(encoding="utf-8-sig"))  # a byte-order mark, as an editor may save one
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read compute calibration {p} ({e}); run `python -m odc_bench.calibrate.cost_model` "
                          f"on that device first") from None


def split_microbatch_fit(fit: dict, layout: Layout, recompute: Recompute) -> np.ndarray:
    """Per-unit costs from a whole-microbatch fit (odc_bench.calibrate.cost_model's file: forward plus
    backward seconds = a * sum((len/unit)^2) + b * sum(len/unit) + c).

    The fit cannot tell units apart, so it is split by the FLOPs model: the quadratic term is
    attention, all in the layers; the linear term goes to the layers and the head in proportion
    to their matrix-multiply parameters; the constant is shared by every traced position; each
    unit's backward takes two thirds of its share, its forward one third. A layer's backward
    gains what checkpointing recomputes of its forward.
    """
    try:
        a, b, c, unit = (float(fit[k]) for k in ("a", "b", "c", "unit"))
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"compute calibration lacks a, b, c, unit ({e})") from None
    cfg = layout.cfg
    L = cfg.num_layers
    layer_lin, head_lin = float(layer_linear_params(cfg)), float(cfg.hidden_size * cfg.vocab_size)
    lin = b / unit / (L * layer_lin + head_lin)
    c0 = c / (layout.positions - 1)
    layer = np.array([c0, lin * layer_lin, a / unit**2 / L]) / 3
    head = np.array([c0, lin * head_lin, 0.0]) / 3
    bwd_layer = layer * np.array([1.0, 2.0 + recompute.matmul, 2.0 + recompute.attention])
    bwd_layer[0] = c0
    table = {
        ("embed", "fwd"): (c0, 0.0, 0.0), ("embed", "bwd"): (0.0, 0.0, 0.0),
        ("layer", "fwd"): (c0, layer[1], layer[2]), ("layer", "bwd"): tuple(bwd_layer),
        ("head", "fwd"): (c0, head[1], 0.0), ("head", "bwd"): (c0, 2 * head[1], 0.0),
    }
    return np.array([table[(k, p)] for k in KINDS for p in PHASES])


# AdamW on an fp32 shard: read parameter, gradient and both moments, write all but the gradient.
ADAMW_BYTES = 28


# What a unit's cost depends on: the calibrated CPU profile's timings are per unit, so a model of
# more or fewer layers of the same unit runs on them, and of another unit does not.
UNIT_SHAPE = ("family", "vocab_size", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim",
              "tie_embeddings")


def unit_shape(model: ModelConfig) -> dict[str, object]:
    return {k: getattr(model, k) for k in UNIT_SHAPE}


def stock_unit_shape(name: str) -> dict[str, object] | None:
    """The unit shape of the stock model config `name`: what a calibration file from before the
    files recorded their shape measured (cpu_profile's runs take `model=NAME` as it is); None for
    a name with no stock config."""
    path = CONF_DIR / "model" / f"{name}.yaml"
    if not path.is_file():
        return None
    return unit_shape(build(ModelConfig, yaml.safe_load(path.read_text(encoding="utf-8")), "model"))


@dataclass(frozen=True)
class CalibratedProfile:
    """This machine's CPU ranks: compute and per-position gaps fitted from real traces."""

    name: str
    path: Path
    data: dict

    @property
    def knots(self) -> tuple[float, ...]:
        """Document lengths past which the fitted cost per squared token rises (layout.doc_features)."""
        return tuple(float(k) for k in self.data.get("knots", ()))

    def compute_table(self, layout: Layout, recompute: Recompute) -> np.ndarray:
        """One fit for every engine (see odc_bench.calibrate.cpu_profile): shape (6, 3 + knots).
        Activation checkpointing (full or blocks) adds to a layer's backward its share of the
        layer's fitted forward, every term of it: a checkpointed layer runs its whole forward
        again, its fixed cost per unit included, as real CPU ranks do (models/checkpointing.py).
        ConfigError for a model whose units are not the calibrated model's (unit_shape)."""
        calibrated = self.data.get("shape") or stock_unit_shape(str(self.data["model"]))
        mine = unit_shape(layout.cfg)
        if calibrated is not None and (differ := [k for k in UNIT_SHAPE if calibrated.get(k) != mine[k]]):
            said = ", ".join(f"{k} {mine[k]} (calibrated: {calibrated.get(k)})" for k in differ)
            raise ConfigError(f"{self.path} was fitted on model {self.data['model']}'s units, not on units of this "
                              f"model's {said}; simulate it on a GPU profile, or calibrate on it (python -m "
                              f"odc_bench.calibrate.cpu_profile model.KEY=VALUE ... --out FILE) and set "
                              f"backend.hardware.calibration=FILE")
        comp = self.data["compute"]
        table = np.array([comp[k][p] for k in KINDS for p in PHASES], dtype=float)
        if recompute.matmul != recompute.attention:
            raise ConfigError("the calibrated CPU profile models backend.recompute_mode=full and blocks, not op: on "
                              "CPU op-level checkpointing recomputes attention too (SDPA runs there as several "
                              "operators), which op's shares leave out; set backend.recompute_mode=full or blocks")
        layer = KINDS.index("layer") * len(PHASES)
        table[layer + PHASES.index("bwd")] += recompute.matmul * table[layer + PHASES.index("fwd")]
        return table

    def check_ranks(self, config: RunConfig, world: int) -> None:
        """ConfigError for a run whose ranks would compute otherwise than the calibration's did:
        on a GPU, compiled where they were eager (or the reverse), or with other CPU threads: a
        threads_per_rank the run sets, or, on the machine the file was calibrated on (its
        fingerprint), null's share of this host's CPUs. Null on another machine is left to the
        fingerprint's check (the what-if's), as every timing of the file is then another's."""
        if config.device == "cuda":
            raise ConfigError(f"{self.path} times this machine's CPU ranks, not device=cuda's; set device=cpu or "
                              f"auto, or simulate GPUs on a GPU profile (backend/hardware=a100 or h100)")
        # A file from before the key's time was fitted on eager runs (the CPU's default).
        compiled = bool(self.data.get("compiled", False))
        if config.compiles("cpu") != compiled:
            was, wanted = ("compile=true", "compile=false") if compiled else ("eager", "compile=true")
            raise ConfigError(f"{self.path} was calibrated on {was} runs, whose timings are not {wanted}'s on this "
                              f"CPU; set compile={str(compiled).lower()}, or calibrate on such runs (python -m "
                              f"odc_bench.calibrate.cpu_profile compile={str(not compiled).lower()} --out FILE) and "
                              f"set backend.hardware.calibration=FILE")
        calibrated = self.data.get("threads") or self.data.get("threads_per_rank")
        if calibrated is None:  # a file from before `threads`, whose runs split the CPUs: not known how many
            return
        threads = config.threads_per_rank
        if threads is None:
            if self.data.get("fingerprint") != host_fingerprint():
                return
            threads = cpu_share(world)  # a local run's share (run/worker.py threads_per_rank)
        if threads != int(calibrated):
            said = f"threads_per_rank={threads}" if config.threads_per_rank is not None else \
                f"threads_per_rank=null ({threads} threads per rank on this host)"
            raise ConfigError(f"{self.path} was calibrated on runs of {calibrated} threads per rank, whose timings are "
                              f"not {said}'s; set threads_per_rank={calibrated}, or calibrate on such runs (python -m "
                              f"odc_bench.calibrate.cpu_profile threads_per_rank=... --out FILE) and set "
                              f"backend.hardware.calibration=FILE")

    def engine_costs(self, engine: str, layout: Layout, world: int, precision: str,
                     odc_gather_bytes: int, shard: str = "full", fetch: str = "owner",
                     internode_slowdown: float = 1.0) -> EngineCosts:
        """The measured gaps; one host, so hybrid sharding and fetch policies do not apply (the
        config refuses hybrid sharding with this profile)."""
        e = self.data.get("engines", {}).get(engine)
        if e is None:
            raise ConfigError(f"{self.path} has no {engine} timings; run `python -m odc_bench.calibrate.cpu_profile "
                              f"--engines {engine} model={self.data['model']}`")
        calibrated_world = int(self.data["world_size"])
        if world != calibrated_world:
            raise ConfigError(f"{self.path} was calibrated with world_size={calibrated_world}, not {world}; "
                              f"calibrate again with world_size={world}")
        # A file from before the key's time was fitted on runs that set no precision: the default's.
        calibrated_precision = str(self.data.get("precision", "fp32"))
        if precision != calibrated_precision:
            raise ConfigError(f"{self.path} was calibrated on precision={calibrated_precision} runs, whose timings "
                              f"are not precision={precision}'s on this CPU; set precision={calibrated_precision}, or "
                              f"calibrate on precision={precision} runs (python -m odc_bench.calibrate.cpu_profile "
                              f"precision={precision} --out FILE) and set backend.hardware.calibration=FILE")
        L, U = layout.cfg.num_layers, layout.units
        pre = np.zeros((2, layout.positions))
        pre[:, 0], pre[:, U - 1], pre[:, U] = e["fwd_embed"], e["fwd_head"], e["bwd_head"]
        pre[:, 1:1 + L] = np.array(e["fwd_layer"])[:, None]
        pre[:, U + 1:2 * U - 1] = np.array(e["bwd_layer"])[:, None]
        zeros = np.zeros(layout.positions)
        return EngineCosts(pre=pre[0], pre_tok=pre[1], tail=e["tail"][0], tail_tok=e["tail"][1], prep=e["prep"],
                           ag=zeros, rs=zeros,
                           gather_load=zeros, push_load=zeros, sync_s=e["sync"],
                           optimizer_s=e["optimizer_per_param"] * float(layout.unit_params.sum()) / world,
                           barrier_s=0.0)


Profile = GpuProfile | CalibratedProfile


def load_profile(hw: HardwareConfig, model_name: str) -> Profile:
    """The profile a config's backend.hardware describes; ConfigError when it cannot be used."""
    if isinstance(hw, GpuHardwareConfig):
        return GpuProfile(hw)
    path = hw.calibration_file(model_name)
    if not path.exists():
        raise ConfigError(f"no calibration {path} for model {model_name}; run "
                          f"`python -m odc_bench.calibrate.cpu_profile model={model_name}` on this machine first")
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"calibration {path} is not readable JSON ({e}); recreate it with "
                          f"python -m odc_bench.calibrate.cpu_profile") from None
    check_calibration(data, path)
    return CalibratedProfile(hw.name, path, data)


def check_calibration(data: dict, path: Path) -> None:
    """The calibration format (docs/simulator.md): refuse a file that lacks a number we need."""
    def check_compute(comp: dict, where: str) -> None:
        for k in KINDS:
            for p in PHASES:
                coeffs = comp[k][p]
                if len(coeffs) != n or not all(math.isfinite(c) for c in coeffs):
                    raise ValueError(f"{where}.{k}.{p} must be {n} finite numbers (3 plus one per knot)")

    try:
        knots = data.get("knots", [])
        if not all(isinstance(k, int | float) and math.isfinite(k) and k >= 0 for k in knots):
            raise ValueError("knots must be document lengths >= 0")
        n = 3 + len(knots)
        check_compute(data["compute"], "compute")
        for name, e in data.get("engines", {}).items():
            missing = [key for key in ENGINE_KEYS if key not in e]
            if missing:
                raise ValueError(f"engines.{name} lacks {', '.join(missing)}")
            if any(len(e[key]) != 2 for key in GAP_CLASSES):
                raise ValueError(f"engines.{name}: every gap is [seconds, seconds per token]")
        int(data["world_size"])
        str(data["model"])
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"calibration {path} is malformed ({e}); recreate it with "
                          f"python -m odc_bench.calibrate.cpu_profile") from None
