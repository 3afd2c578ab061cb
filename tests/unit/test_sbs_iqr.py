"""Algorithm 3 (IQR-aware lexicographic decode placement): hand-worked cases and properties."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ebctl.sbs.iqr import place_decode, quartiles, threshold


def test_outlier_is_masked_even_with_the_smallest_batch():
    # K = 100..400 and 5000: Q1 = 200, Q3 = 400, Th = 400 + 1.5·200 = 700, so unit 4 (B = 0) is masked.
    # Longest first: 1000 → the safe unit with least (B, K) = unit 0 (B 3, K 100); then K = [1100, 200,
    # 300, 400, 5000]: Q1 = 300, Q3 = 1100, Th = 2300, B = [4, 3, 3, 3, 0] → unit 1 (B 3, K 200).
    unit, b, k = place_decode([500, 1000], [3, 3, 3, 3, 0], [100, 200, 300, 400, 5000])
    assert unit == [1, 0]
    assert b == [4, 4, 3, 3, 0] and k == [1100, 700, 300, 400, 5000]


def test_batch_size_first_then_kv():
    unit, _, _ = place_decode([10], [2, 1, 3, 1], [100, 900, 100, 500])
    assert unit == [3]  # B = 1 on units 1 and 3; K breaks the tie: 500 < 900


def test_without_outliers_it_is_the_plain_lexicographic_rule():
    unit, b, _ = place_decode([5, 5, 5, 5], [0, 0], [0, 0])
    assert unit == [0, 1, 0, 1] and b == [2, 2]


def test_bad_input_is_named():
    try:
        place_decode([1], [1, 2], [1])
    except ValueError as e:
        assert "one batch size and one KV load per unit" in str(e)
    else:
        raise AssertionError("expected ValueError")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=70))
def test_quartiles_match_numpy(values):
    q1, q3 = quartiles(sorted(values))
    assert np.isclose(q1, np.percentile(values, 25)) and np.isclose(q3, np.percentile(values, 75))


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 50_000), max_size=40),
       units=st.lists(st.tuples(st.integers(0, 64), st.integers(0, 500_000)), min_size=1, max_size=32),
       k=st.sampled_from([0.0, 0.5, 1.5, 3.0]))
def test_properties(lengths, units, k):
    b0, k0 = [u[0] for u in units], [u[1] for u in units]
    unit, b, kv = place_decode(lengths, b0, k0, k=k)
    # every request placed exactly once, and the final state is the sum of the placements
    assert len(unit) == len(lengths)
    for n in range(len(units)):
        mine = [lengths[i] for i in range(len(lengths)) if unit[i] == n]
        assert b[n] == b0[n] + len(mine) and kv[n] == k0[n] + sum(mine)
    # replay longest first: the mask never empties and the pick is the lexicographic min of the safe set
    bb, kk = list(b0), list(k0)
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        th = threshold(sorted(kk), k)
        safe = [n for n in range(len(bb)) if kk[n] <= th]
        assert safe
        assert unit[i] in safe and (bb[unit[i]], kk[unit[i]]) == min((bb[n], kk[n]) for n in safe)
        bb[unit[i]] += 1
        kk[unit[i]] += lengths[i]
