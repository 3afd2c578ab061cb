"""The model's record on this engine, and a trial's test with the model's prediction as its prior.

The tuner's trials measure a challenger's ln ratio to the incumbent in pairs of windows (``ebctl.trial``). The
model (``ebctl.predict``: the engine simulator on the served requests) predicts that ratio before the trial. Two
pieces, both pure functions of frozen records:

* :class:`Record`: every decided trial's predicted and measured ln ratio. Its error sd (the RMS of measured −
  predicted, shrunk towards ``PRIOR_MODEL_SD`` with the weight of ``PRIOR_TRIALS`` trials) is how far the model
  has earned trust here: a planner corrects its estimates by actual / expected the same way.
* :func:`judge`: the normal-normal posterior of the effect, the prediction N(ĝ, σ_m²) as the prior and the pairs'
  mean N(d̄, s²/n) as the data (precisions add). The challenger wins when the posterior mean is at least
  ln(1 + ``min_effect``) and its 95% interval excludes 0; it loses when the interval lies below ln(1 + min_effect),
  when the posterior mean is ≤ 0, or after ``max_pairs``. A model with a good record (small σ_m) decides on a
  pair or two; one with a poor record weighs little, and the pairs decide as ``trial.verdict`` does.
* :func:`at_once`: the model's best arm is taken without a trial where its predicted lead is beyond
  ``AT_ONCE_Z`` times its recorded error, on a record of at least ``AT_ONCE_TRIALS`` trials.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ebctl.trial import PRIOR_PAIRS, Verdict

PRIOR_MODEL_SD = 0.03  # sd (ln) of the model's error before it has a record on this engine
PRIOR_TRIALS = 2  # the weight of PRIOR_MODEL_SD, in trials
KEEP = 16  # trials the record keeps
Z = 1.96  # the 95% interval's half width in sd
AT_ONCE_Z, AT_ONCE_TRIALS = 4.0, 3


@dataclass(frozen=True, slots=True)
class Record:
    """The model's predicted and measured ln ratios of the last ``KEEP`` decided trials."""

    predicted: tuple[float, ...] = ()
    measured: tuple[float, ...] = ()

    def add(self, predicted: float, measured: float) -> Record:
        """The record with one more trial (unchanged where either figure is not finite)."""
        if not (math.isfinite(predicted) and math.isfinite(measured)):
            return self
        return Record((*self.predicted[-(KEEP - 1):], predicted), (*self.measured[-(KEEP - 1):], measured))

    @property
    def n(self) -> int:
        return len(self.predicted)

    def errors(self) -> np.ndarray:
        """measured − predicted, per trial."""
        return np.asarray(self.measured) - np.asarray(self.predicted)

    def sd(self) -> float:
        """The model's error sd here: √((Σ e² + PRIOR_TRIALS · PRIOR_MODEL_SD²) / (n + PRIOR_TRIALS))."""
        e = self.errors()
        return math.sqrt((float((e * e).sum()) + PRIOR_TRIALS * PRIOR_MODEL_SD**2) / (self.n + PRIOR_TRIALS))

    def mean_abs(self) -> float:
        """The mean |error| (NaN before any trial)."""
        return float(np.abs(self.errors()).mean()) if self.n else math.nan


def judge(d: np.ndarray, *, predicted: float, model_sd: float, prior_sd: float, min_pairs: int, max_pairs: int,
          min_effect: float) -> Verdict:
    """The test of a trial's pairs ``d`` (ln ratios) with the prediction ``predicted`` (sd ``model_sd``) as its
    prior (module docstring). A pair's sd is shrunk towards ``prior_sd`` as ``trial.verdict`` shrinks it. The
    Verdict's effect is the posterior mean, its half width the posterior interval's."""
    n = len(d)
    prec0 = 1.0 / max(model_sd, 1e-6) ** 2
    if n == 0:
        return Verdict("", predicted, Z / math.sqrt(prec0))
    mean_d = float(d.mean())
    ss = float(((d - mean_d) ** 2).sum())
    s2 = (ss + PRIOR_PAIRS * prior_sd**2) / (n - 1 + PRIOR_PAIRS)
    prec = prec0 + n / s2
    mean = (predicted * prec0 + mean_d * n / s2) / prec
    half = Z / math.sqrt(prec)
    if n < min_pairs:
        return Verdict("", mean, half)
    bar = math.log1p(min_effect)
    if mean >= bar and mean - half > 0:
        return Verdict("win", mean, half, f"with the model's prior ({math.expm1(predicted):+.1%} ± "
                                          f"{math.expm1(Z * model_sd):.1%}): {math.expm1(mean):+.1%}")
    if mean + half < bar or mean <= 0 or n >= max_pairs:
        return Verdict("lose", mean, half, f"with the model's prior ({math.expm1(predicted):+.1%}): "
                                           f"{math.expm1(mean):+.1%} ± {math.expm1(half):.1%}")
    return Verdict("", mean, half)


def at_once(lead: float, record: Record, min_effect: float) -> bool:
    """Take the model's arm without a trial: a record of ``AT_ONCE_TRIALS`` trials at least, and a predicted lead
    (ln) beyond ln(1 + min_effect) by ``AT_ONCE_Z`` recorded error sds."""
    return record.n >= AT_ONCE_TRIALS and lead - AT_ONCE_Z * record.sd() > math.log1p(min_effect)
