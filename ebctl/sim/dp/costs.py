"""The DP+EP cost model: what one forward of one DP rank costs, priced with the shared ``costmodel``.

There is no DeepSeek-V3 profile. The SBS paper's deployment is DeepSeek-V3 (37B active parameters per
token) with TP = 4 per DP rank. We scale the one MoE profile shipped, Qwen3-30B-A3B on H200 (3.3B active,
one GPU): the per-token prefill and per-request decode coefficients by the active parameters each GPU
computes, 37/4 ÷ 3.3 ≈ 2.8, and keep the intercepts (fixed per-forward costs: launches, expert dispatch,
synchronisation, which do not grow with the model). Prefill is compute-bound and H800/H200 have the same
dense compute, so no GPU factor. The lockstep barrier is not in these costs: ``ranks.Instance`` makes
every forward of a DP-attention instance last as long as its slowest rank's.
"""

from __future__ import annotations

from ebctl import profiles
from ebctl.costmodel import IterationCosts, PhaseCost

DPEP_PROFILE = "qwen3-30b-a3b/h200"
DPEP_SCALE = 37 / 4 / 3.3  # DeepSeek-V3 active parameters per GPU at TP 4, over Qwen3-30B-A3B's on one GPU
# Decode attention per KV token and request: the measured H200 kernel (measured_profiles.json
# attention_kernel_ms, pure_decode_512q: +0.19 ms per layer from context 128 to 512 for 512 queries, 8 KV
# heads of 128) × 48 layers × 0.5 (Qwen3-30B-A3B has 4 KV heads) × 0.71 (DeepSeek-V3's MLA cache, 576
# values × 61 layers, over 1,024 × 48) ≈ 1.7e-8 s. β_d already holds a 512-token context (~9 µs of 68).
DECODE_CTX_S = 0.19e-3 / 384 / 512 * 48 * 0.5 * 0.71


def build(profile: str = DPEP_PROFILE, scale: float = DPEP_SCALE) -> IterationCosts:
    """Prefill: α_p + scale·β_p per token; decode: α_d + scale·β_d per request + γ per KV token."""
    if not scale > 0:
        raise ValueError(f"cost scale {scale}: must be > 0")
    c = profiles.load(profile).costs
    return IterationCosts(prefill=PhaseCost(intercept_s=c.alpha_p, prefill_token_s=c.beta_p * scale),
                          decode=PhaseCost(intercept_s=c.alpha_d, decode_req_s=c.beta_d * scale,
                                           decode_ctx_token_s=DECODE_CTX_S))


def describe(costs: IterationCosts) -> str:
    p, d = costs.prefill, costs.decode
    return (f"prefill {p.intercept_s * 1e3:.2f} ms + {p.prefill_token_s * 1e6:.2f} µs/token; "
            f"decode {d.intercept_s * 1e3:.2f} ms + {d.decode_req_s * 1e6:.2f} µs/request + "
            f"{d.decode_ctx_token_s * 1e9:.1f} ns/KV token")
