"""The DP+EP cost model: what one forward of one DP rank costs, priced with the shared ``costmodel``.

There is no DeepSeek-V3 profile. The SBS paper's deployment is DeepSeek-V3 (37B active parameters per
token) with TP = 4 per DP rank. Two named assumptions build one:

1. **Compute scale** (``dpep-compute``): the one MoE profile shipped, Qwen3-30B-A3B on H200 (3.3B active,
   one GPU), with the per-token prefill and per-request decode coefficients × 37/4 ÷ 3.3 ≈ 2.8 (the
   active parameters each GPU computes) and the intercepts kept (launches, expert dispatch, sync do not
   grow with the model). H800 and H200 have the same dense compute, so no GPU factor. A full 3K chunk
   then takes 134 ms.
2. **Deployment slowdown** (``dpep``, the default): the paper's own figures say its forwards were about
   5.8× slower than that. Its Table 1 baseline served 57 QPS (chunk 3K, 51.83% chunk utilisation) and
   70 QPS (chunk 5K, 53.0%) with 1K-token prompts on three prefill instances of 8 DP ranks: if each
   instance was never idle at that peak, one forward took 0.5183 · 8 · 3,072 / (57/3 · 1,000) = 0.67 s and
   0.93 s. The simulator's total-tokens on model 1 at the same utilisations runs forwards about 5.8× shorter
   at both chunk sizes (``tools/sim_dp_table.py --calibrate``), so every prefill coefficient is multiplied
   by 5.8. Whatever makes the real forwards slower than compute (all-to-all
   over 4 nodes, MLA, scheduling) is in this one factor; it matters because a mean-TTFT SLO of 1 s is
   1.3 forwards under it and 7.5 under model 1, and where the SLO binds decides what dispatch can win.

The lockstep barrier is not in these costs: ``ranks.Instance`` makes every forward of a DP-attention
instance last as long as its slowest rank's. Decode keeps model 1 (Table 1 measures prefill only).
"""

from __future__ import annotations

from ebctl import profiles
from ebctl.costmodel import IterationCosts, PhaseCost

DPEP_PROFILE = "qwen3-30b-a3b/h200"
DPEP_SCALE = 37 / 4 / 3.3  # DeepSeek-V3 active parameters per GPU at TP 4, over Qwen3-30B-A3B's on one GPU
DPEP_SLOWDOWN = 5.8  # the paper's Table 1 forwards over model 1's at the same chunk utilisation
# Decode attention per KV token and request: the measured H200 kernel (measured_profiles.json
# attention_kernel_ms, pure_decode_512q: +0.19 ms per layer from context 128 to 512 for 512 queries, 8 KV
# heads of 128) × 48 layers × 0.5 (Qwen3-30B-A3B has 4 KV heads) × 0.71 (DeepSeek-V3's MLA cache, 576
# values × 61 layers, over 1,024 × 48) ≈ 1.7e-8 s. β_d already holds a 512-token context (~9 µs of 68).
DECODE_CTX_S = 0.19e-3 / 384 / 512 * 48 * 0.5 * 0.71
NAMES = ("dpep", "dpep-compute")


def build(profile: str = DPEP_PROFILE, scale: float = DPEP_SCALE, slowdown: float = DPEP_SLOWDOWN
          ) -> IterationCosts:
    """Prefill: slowdown·(α_p + scale·β_p per token); decode: α_d + scale·β_d per request + γ per KV token."""
    if not (scale > 0 and slowdown > 0):
        raise ValueError(f"cost scale {scale} and slowdown {slowdown}: must be > 0")
    c = profiles.load(profile).costs
    return IterationCosts(prefill=PhaseCost(intercept_s=c.alpha_p * slowdown,
                                            prefill_token_s=c.beta_p * scale * slowdown),
                          decode=PhaseCost(intercept_s=c.alpha_d, decode_req_s=c.beta_d * scale,
                                           decode_ctx_token_s=DECODE_CTX_S))


def named(name: str) -> IterationCosts:
    """``dpep`` (calibrated, the default), ``dpep-compute`` (compute scale only), or any profile unscaled."""
    if name == "dpep":
        return build()
    if name == "dpep-compute":
        return build(slowdown=1.0)
    return build(name, 1.0, 1.0)


def describe(costs: IterationCosts) -> str:
    p, d = costs.prefill, costs.decode
    return (f"prefill {p.intercept_s * 1e3:.2f} ms + {p.prefill_token_s * 1e6:.2f} µs/token; "
            f"decode {d.intercept_s * 1e3:.2f} ms + {d.decode_req_s * 1e6:.2f} µs/request + "
            f"{d.decode_ctx_token_s * 1e9:.1f} ns/KV token")
