"""How much memory a rank needs: the model's shards, the unit it is computing, and activations.

An estimate, per rank, in bytes, for the sharded layouts both engines use (FSDP's flat
parameters, ZeRO-3: every rank owns 1/world of every unit; with hybrid sharding, 1/group of
every unit for the ranks of one node, `shard_over`, each node holding a replica):

- owned shards: fp32 master parameters, the fp32 gradient accumulator and AdamW's two fp32
  moments (16 bytes per owned parameter), plus with bf16 compute a bf16 copy of the shard
  where the engine keeps one (ODC's gather source; FSDP2 casts at each all-gather instead,
  its FSDPParam.all_gather_inputs, so the cast is one unit's and counted with the working units);
- working units: the unit being computed and the one prefetched, unsharded in the compute
  dtype, and the unit's flat gradient (three units' worth at the largest unit);
- activations of one microbatch of max_tokens tokens, what autograd saves for backward:
  every decoder layer's tensors, or with recomputation only each layer's input plus one
  layer's tensors (block-level selective recomputation: that for its share of the layers);
  the loss head is counted as fused cross-entropy kernels run it (logits a chunk at a time:
  the chunk's logits and their gradient in bf16, as many bytes as the chunk's fp32 logits;
  the harness's own model on CUDA runs models/loss.py so), since a full fp32 logits tensor at
  64K tokens and a 152K vocabulary (40 GB) is what no long-context trainer keeps. Attention
  is flash attention's (linear in the tokens) on GPUs; on CPU, torch's attention keeps each
  document's score matrix: at most max_tokens x the longest document's length of scores per head.

Hybrid sharding keeps the optimizer states with the shards (FSDP2's HSDP; the paper's section
6.1 also spreads them over the nodes, which this layout does not) and reduces the gradients
across nodes in place (NCCL's all-reduce of the reduce-scatter's output, or of ODC's
accumulator), so only the owned part changes: every term else is per unit or per token.

What it leaves out: the framework's own buffers and fragmentation (a few percent on GPUs).
On CPU ranks (`cpu_longest`) the harness's own model (models/decoder.py) is counted as it runs
there: each document's score matrices, the full fp32 logits and their gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

from odc_bench.config.model import ModelConfig
from odc_bench.models.flops import layer_linear_params

# AdamW on fp32 shards: master parameters, gradient accumulator, two moments.
OWNED_BYTES = 16
MOMENT_BYTES = 8
# Logits the fused loss keeps at once (tokens): what a chunked cross-entropy holds.
LOSS_CHUNK_TOKENS = 4096


def kind_params(cfg: ModelConfig) -> dict[str, int]:
    """Parameters of one unit of each kind (embed, layer, head): what FSDP shards, gathers and reduces."""
    kv = cfg.num_kv_heads * cfg.head_size
    biases = cfg.attention_width + 2 * kv if cfg.arch.qkv_bias else 0
    qk_norms = 2 * cfg.head_size if cfg.arch.qk_norm else 0
    layer = layer_linear_params(cfg) + biases + qk_norms + 2 * cfg.hidden_size  # two norms
    embed = cfg.vocab_size * cfg.hidden_size
    # Tied embeddings: the head's projection is the embedding matrix, held (and counted) once.
    head = (0 if cfg.tie_embeddings else cfg.vocab_size * cfg.hidden_size) + cfg.hidden_size
    return {"embed": embed, "layer": layer, "head": head}


def unit_params(cfg: ModelConfig) -> list[int]:
    """Parameters of every unit, in the order of cfg.units."""
    per_kind = kind_params(cfg)
    return [per_kind[kind] for _, kind in cfg.units]


def layer_activation_bytes(cfg: ModelConfig, tokens: int, itemsize: int, longest: int | None = None) -> int:
    """What one decoder layer saves for backward on `tokens` tokens. Counted tensor by tensor:
    the two norms' inputs and outputs, q, k and v (and, with qk_norm, q and k before their
    norms), the attention output and its log-sum-exp,
    o_proj's input, the MLP's gate, up, their activation and product (a plain MLP: up and its
    activation). Without flash attention
    (`longest`: the longest document) also every head's attention probabilities, whose sum of
    squared document lengths is at most tokens x longest."""
    h, i, q = cfg.hidden_size, cfg.intermediate_size, cfg.attention_width
    kv = cfg.num_kv_heads * cfg.head_size
    mlp = 4 * i if cfg.arch.gated_mlp else 2 * i
    qk_norms = q + kv if cfg.arch.qk_norm else 0  # q and k before their norms, beside them after
    per_token = 4 * h + (q + 2 * kv) + qk_norms + q + q + mlp
    scores = 0 if longest is None else cfg.num_heads * tokens * min(tokens, longest) * itemsize
    return tokens * (per_token * itemsize + 4 * cfg.num_heads) + scores


@dataclass(frozen=True)
class MemoryEstimate:
    owned: int
    working: int
    activations: int

    @property
    def total(self) -> int:
        return self.owned + self.working + self.activations


def estimate(cfg: ModelConfig, world_size: int, precision: str, max_tokens: int,
             recompute: float = 0.0, cpu_longest: int | None = None, shard_over: int | None = None,
             version_slots: int = 1, compute_shard_copy: bool = True) -> MemoryEstimate:
    """Per-rank bytes of a run that shards every unit over `world_size` ranks (or, with hybrid
    sharding, over the `shard_over` ranks of a node). For the harness's model on CPU
    (models/decoder.py), give `cpu_longest`, the longest document: attention then keeps its
    score matrices and the head the full fp32 logits and their gradient.
    `version_slots`: copies of the master shard, its bf16 copy and the accumulator
    (stale-synchronous ODC keeps staleness + 1; AdamW's moments stay one).
    `compute_shard_copy`: whether the engine keeps that bf16 copy (registry.EngineSpec)."""
    itemsize = 2 if precision == "bf16" else 4
    # By kind, not unit by unit: a model's size is checked before anything lists its layers.
    per_kind, count = kind_params(cfg), cfg.unit_counts
    group = world_size if shard_over is None else shard_over
    slotted = OWNED_BYTES - MOMENT_BYTES + (itemsize if itemsize < 4 and compute_shard_copy else 0)
    owned_per_param = MOMENT_BYTES + version_slots * slotted
    owned = sum(count[kind] * -(-p // group) for kind, p in per_kind.items()) * owned_per_param
    working = 3 * max(per_kind.values()) * itemsize
    layer = layer_activation_bytes(cfg, max_tokens, itemsize, cpu_longest)
    hidden = max_tokens * cfg.hidden_size * itemsize
    # `recompute`: the share of layers checkpointed, which keep only their input; one layer's
    # activations are alive again while its backward runs.
    layers = cfg.num_layers * (recompute * hidden + (1 - recompute) * layer) + (layer if recompute else 0)
    logits = min(max_tokens, LOSS_CHUNK_TOKENS) if cpu_longest is None else 2 * max_tokens
    head = hidden + logits * cfg.vocab_size * 4
    inputs = max_tokens * 3 * 8  # token ids, positions and labels, int64
    return MemoryEstimate(owned=owned, working=working, activations=round(layers + head + inputs))

