"""KV capacity from public model and GPU numbers (vLLM's arithmetic)."""

from __future__ import annotations

from ebctl.sim import hardware


def test_kv_capacity_follows_vllm_arithmetic():
    q = hardware.MODELS["Qwen/Qwen3-8B"]
    assert q.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2 == 147_456
    h200 = hardware.kv_capacity_tokens("Qwen/Qwen3-8B", "H200")
    rtx = hardware.kv_capacity_tokens("Qwen/Qwen3-8B", "RTX-PRO-6000")
    free = 0.9 * 140.4 * 2**30 - 2 * 8.19e9 - 2 * 2**30
    assert h200 == int(free // 147_456)
    assert 700_000 < h200 < 900_000 and 400_000 < rtx < 600_000 and rtx < h200
    # a bigger model leaves less room; unknown names fall back
    assert hardware.kv_capacity_tokens("Qwen/Qwen3-30B-A3B", "RTX-PRO-6000") < rtx
    assert hardware.kv_capacity_tokens("x/y", "H200") == hardware.FALLBACK_KV_TOKENS
    assert hardware.model_spec("Qwen/Qwen3-30B-A3B").attention_scale == 0.5
