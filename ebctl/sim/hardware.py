"""What the simulator needs to know about a model and a GPU beyond the cost profile: layer count, KV bytes
per token, weight bytes and memory, hence the KV capacity C a serving engine would have.

Public numbers (model cards, GPU datasheets); the KV capacity follows vLLM's arithmetic:
C = (gpu_memory_utilization · memory − weights − activation reserve) / KV bytes per token.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class ModelSpec:
    layers: int
    kv_heads: int
    head_dim: int
    params: float  # parameter count (weights in 16-bit: 2 bytes each)

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2  # K and V, 16-bit

    @property
    def attention_scale(self) -> float:
        """Decode attention streams the KV cache: relative to the measured kernel (8 KV heads of 128)."""
        return self.kv_heads * self.head_dim / (8 * 128)


MODELS: dict[str, ModelSpec] = {
    "Qwen/Qwen3-8B": ModelSpec(layers=36, kv_heads=8, head_dim=128, params=8.19e9),
    "Qwen/Qwen3-30B-A3B": ModelSpec(layers=48, kv_heads=4, head_dim=128, params=30.5e9),
    "meta-llama/Llama-3.1-8B-Instruct": ModelSpec(layers=32, kv_heads=8, head_dim=128, params=8.03e9),
}
DEFAULT_MODEL = MODELS["Qwen/Qwen3-8B"]

GPU_MEMORY_GIB: dict[str, float] = {"H200": 140.4, "RTX-PRO-6000": 95.6, "L40S": 44.4, "B300": 268.0}

MEM_UTIL = 0.9  # vLLM's default gpu_memory_utilization
ACTIVATION_RESERVE_GIB = 2.0  # peak activations and workspace in eager mode (no CUDA graphs)
FALLBACK_KV_TOKENS = 500_000


def model_spec(model: str) -> ModelSpec:
    """The named model's spec, or Qwen3-8B's for an unknown one (the measured attention kernel's shape)."""
    return MODELS.get(model, DEFAULT_MODEL)


def kv_capacity_tokens(model: str, gpu: str) -> int:
    """KV tokens a vLLM-like engine would get for this model on this GPU; FALLBACK_KV_TOKENS if unknown."""
    spec, mem = MODELS.get(model), GPU_MEMORY_GIB.get(gpu.upper())
    if spec is None or mem is None:
        return FALLBACK_KV_TOKENS
    free = MEM_UTIL * mem * GIB - 2.0 * spec.params - ACTIVATION_RESERVE_GIB * GIB
    return max(int(free // spec.kv_bytes_per_token), 0) or FALLBACK_KV_TOKENS
