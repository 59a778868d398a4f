"""The model's shape: a Qwen2-architecture decoder (conf/model/*.yaml)."""

from __future__ import annotations

from dataclasses import dataclass

from odc_bench.config.fields import require


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads"):
            value = getattr(self, key)
            require(value >= 1, f"model.{key} must be at least 1, got {value}")
        require(not (self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads),
                f"model: hidden_size {self.hidden_size} must divide by num_heads {self.num_heads}, "
                f"and num_heads by num_kv_heads {self.num_kv_heads}")
        # Rotary embeddings rotate pairs of a head's dimensions.
        require(self.head_dim % 2 == 0, f"model: hidden_size / num_heads = {self.head_dim} must be even "
                                        f"(rotary embeddings rotate pairs of dimensions); change num_heads")
        require(self.rope_theta > 0 and self.rms_eps > 0,
                f"model.rope_theta and model.rms_eps must be positive, got {self.rope_theta} and {self.rms_eps}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads
