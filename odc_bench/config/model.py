"""The model: its architecture family and shape (conf/model/*.yaml).

Every family is a pre-norm decoder with rotary positions; they differ in what their layers hold.
One record per family, read alike by the harness's model (models/decoder.py), its parameter,
FLOPs and memory counts (models/flops.py, models/memory.py) and the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass

from odc_bench.config.fields import require


@dataclass(frozen=True)
class ModelFamily:
    name: str
    qkv_bias: bool  # the q, k and v projections carry biases
    gated_mlp: bool  # SwiGLU (gate, up and down projections) or a plain GELU MLP (up and down)
    about: str
    qk_norm: bool = False  # an RMSNorm over each head's q and k, before the rotary embedding


FAMILIES = {f.name: f for f in (
    ModelFamily("qwen2", qkv_bias=True, gated_mlp=True, about="Qwen2 and Qwen2.5 (the paper's models)"),
    ModelFamily("llama", qkv_bias=False, gated_mlp=True, about="Llama 2 and Llama 3: no biases"),
    ModelFamily("qwen3", qkv_bias=False, gated_mlp=True, qk_norm=True,
                about="Qwen3's dense models: no biases, each head's q and k normalised"),
    # MPT's ALiBi and bias-free LayerNorm run here as rotary positions and RMSNorm: the same
    # parameters, and FLOPs that differ only in elementwise work.
    ModelFamily("mpt", qkv_bias=False, gated_mlp=False, about="MosaicML's MPT: a GELU MLP, no biases"),
)}


# The kinds of sharding unit, in the order a cost table lists them (sim/layout.py).
UNIT_KINDS = ("embed", "layer", "head")


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    name: str
    family: str = "qwen2"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    # Channels per attention head where a model sets them apart from its width (Mistral NeMo:
    # 32 heads of 128 on a width of 5120); unset, hidden_size / num_heads.
    head_dim: int | None = None
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        require(self.family in FAMILIES, f"model.family must be one of {', '.join(FAMILIES)}, got {self.family!r}")
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads"):
            value = getattr(self, key)
            require(value >= 1, f"model.{key} must be at least 1, got {value}")
        if self.head_dim is None:
            require(self.hidden_size % self.num_heads == 0,
                    f"model: hidden_size {self.hidden_size} must divide by num_heads {self.num_heads}, "
                    f"or model.head_dim must say how wide each head is")
            # Rotary embeddings rotate pairs of a head's dimensions.
            require(self.head_size % 2 == 0, f"model: hidden_size / num_heads = {self.head_size} must be even "
                                             f"(rotary embeddings rotate pairs of dimensions); change num_heads")
        else:
            require(self.head_dim >= 2 and self.head_dim % 2 == 0,
                    f"model.head_dim must be even and at least 2 (rotary embeddings rotate pairs of dimensions), "
                    f"got {self.head_dim}")
            if self.head_dim * self.num_heads == self.hidden_size:
                # The default spelled out: one model, one record (and run key) either way.
                object.__setattr__(self, "head_dim", None)
        require(self.num_heads % self.num_kv_heads == 0,
                f"model: num_heads {self.num_heads} must divide by num_kv_heads {self.num_kv_heads}")
        require(self.rope_theta > 0 and self.rms_eps > 0,
                f"model.rope_theta and model.rms_eps must be positive, got {self.rope_theta} and {self.rms_eps}")

    @property
    def arch(self) -> ModelFamily:
        """The family's record: what the layers hold beyond the shape."""
        return FAMILIES[self.family]

    @property
    def units(self) -> list[tuple[str, str]]:
        """The sharding units in execution order, each with its kind: the embeddings, every
        decoder layer, and the head (final norm, LM head and loss). The decoder's named_units,
        the parameter counts and the simulator's layout all follow this list."""
        return [("embed", "embed"), *((f"layer{i}", "layer") for i in range(self.num_layers)), ("head", "head")]

    @property
    def unit_counts(self) -> dict[str, int]:
        """How many units of each kind `units` lists, without listing them."""
        return {"embed": 1, "layer": self.num_layers, "head": 1}

    @property
    def head_size(self) -> int:
        """Channels per attention head: head_dim where set, else hidden_size / num_heads."""
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def attention_width(self) -> int:
        """Channels of all query heads together: what q_proj makes and o_proj takes, and the
        width attention's FLOPs scale with."""
        return self.num_heads * self.head_size
