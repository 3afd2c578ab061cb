"""Algorithm 1 as a pure decision (ebctl.decide) on hand-worked cases.

The window: 1,024 output lengths with exactly geometric counts, 512 of length 1, 256 of length 2, ... (p = 1/2):
the hazard #{O = t}/#{O ≥ t} is exactly 1/2 at every t up to the 95th percentile, so the fit gives p0 = 0.5 and
η = 0. Costs with γ = p0·α_p/α_d = 1 + ln(1/2) = 0.306853 put Eq. 3's root at θ0 = 1/2 exactly
(θ/(1−θ) + ln(1−θ) = 1 − 0.693147 at θ = 1/2).
"""

import dataclasses
import math

import numpy as np
import pytest

from ebctl import model
from ebctl.decide import Carry, Snapshot, decide
from ebctl.params import ControllerParams
from ebctl.protocol import Mode

OUTPUTS = np.concatenate([np.full(512 >> i if i < 9 else 2, i + 1) for i in range(10)])
GAMMA = 1.0 + math.log(0.5)
COSTS = model.Costs(alpha_p=GAMMA * 0.01 / 0.5, beta_p=1e-5, alpha_d=0.01, beta_d=1e-4)
P = ControllerParams(mode="eb", theta_method="cfr", n_min_interval_s=2.0)


def snap(now=10.0, **kw):
    base = dict(now=now, inputs=np.full(len(OUTPUTS), 100.0), outputs=OUTPUTS.astype(float), costs=COSTS,
                cost_source="profile", eq8_costs=None, n_limit=64, kv_total=0, n_obs=math.nan,
                mixed_unavailable=False)
    return Snapshot(**{**base, **kw})


def test_cfr_threshold_and_the_limit_while_the_kv_capacity_is_unknown():
    d = decide(snap(), Carry.initial(P, 64), P)
    f = d.fit
    assert (f.p0, f.hz.eta) == (0.5, 0.0) and f.theta0 == pytest.approx(0.5, abs=1e-9) and f.d_theta == 0.0
    # N = the limit 64 (no KV capacity to size it by), k = ⌊0.5 · 64⌋ = 32, the operator's mode
    assert (f.n, f.k, f.mode, f.kv) == (64, 32, Mode.EB, 0.0)
    assert "KV capacity unknown: N = engine limit" in f.reasons and d.carry.n_star == 64
    assert decide(snap(), Carry.initial(P, 64), P) == d  # pure: the same inputs, the same decision


def test_n_changes_at_most_every_n_min_interval_s():
    # the carry says N = 40, set 1 s ago: the limit 64 must wait (2 s), k = ⌊0.5 · 40⌋ = 20
    held = decide(snap(now=10.0), Carry(n_star=40, n_changed_at=9.0), P)
    assert (held.fit.n, held.fit.k, held.carry.n_changed_at) == (40, 20, 9.0)
    moved = decide(snap(now=11.0), held.carry, P)
    assert (moved.fit.n, moved.fit.k, moved.carry.n_star, moved.carry.n_changed_at) == (64, 32, 64, 11.0)


def test_theta_is_clipped_and_the_overrides_pin():
    tight = dataclasses.replace(P, theta_max=0.25)
    f = decide(snap(), Carry.initial(tight, 64), tight).fit
    assert f.theta == 0.25 and f.k == 16  # ⌊0.25 · 64⌋
    pin = dataclasses.replace(P, k_override=5, n_override=20)
    f = decide(snap(), Carry.initial(pin, 64), pin).fit
    assert (f.n, f.k) == (20, 5) and "pinned by operator: k=5, n_max=20" in f.reasons


def test_eb_plus_without_a_mixed_cost_stays_in_eb_and_counts_no_update():
    ebp = dataclasses.replace(P, mode="eb+")
    c0 = Carry.initial(ebp, 64)
    d = decide(snap(eq8_costs=COSTS), c0, ebp)
    assert d.fit.mode is Mode.EB and "mixed cost unknown: eb" in d.fit.reasons
    assert d.carry.updates_since_switch == c0.updates_since_switch and math.isnan(d.carry.eq8_band)
    with pytest.raises(ValueError, match=r"Eq\. 8"):
        decide(snap(), c0, ebp)  # eb+ without Eq. 8's costs is the caller's bug
