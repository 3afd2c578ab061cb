"""The paper's GPU measurements (``ebctl/data/paper_measurements.json``, with their source) and workloads
with the statistics of its Table 9.

Table 9 gives, per workload, the input range and mean and the output range, mean and σ, not the
distributions. Our choice (documented here and in docs/results/sim_vs_paper.md):

* outputs: a Gamma distribution clipped to the range (a value beyond an end is set to that end, as a
  max_tokens cap does: ShareGPT's outputs pile up at 500), its two parameters solved so that the *clipped*
  mean and σ are Table 9's (a Gamma of shape > 1 has a rising hazard, as Table 9 marks every workload IFR);
* inputs: ShareGPT and NuminaMath a lognormal clipped to the range with an assumed log-σ (1.0: chat
  prompts are heavy-tailed; 0.6: math problems vary less), its location solved for Table 9's mean;
  LongBench uniform on its range [1,000, 4,000] (mean 2,500; Table 9: 2,492).

Lengths are drawn, clipped, then rounded to whole tokens.

What the paper served on NuminaMath is not its Table 9 row (``served``): its own figures for that workload
(Table 2's requests/s, section 4.3.3's TPOT, Tables 14-15's N = 256) give, by Little's law, mean output =
running / (requests/s · TPOT) ≈ 3,700-4,300 tokens on both GPUs (RTX PRO 6000 v1: 256 / (0.73 · 0.08175) =
4,290 at most; H200 v1: 256 / (1.95 · 0.03103) = 4,231 at most), not 1,039: the reasoning model's answers run
to the serving cap (section 4.1: "122 / 800–4,000"; "output lengths are truncated during serving"). So the
served outputs: ``NUMINA_CAPPED_SHARE`` of the requests at the 4,000-token cap, the rest uniform on
[800, 4,000] (mean 3,840; Little's law then puts 185-232 of the 256 slots decoding in the four measured runs).

Also here, from the paper's text, what the fit needs beside the tables in the JSON file: the best (B, N) of
each scheduler (``BEST_CONFIG``, Tables 14 and 15) and the TPOT figures quoted in section 4.3.3 (``TPOT_MS``).
"""

from __future__ import annotations

import functools
import json
from importlib import resources

import numpy as np
from scipy import optimize, stats

INPUT_LOG_SIGMA = {"ShareGPT": 1.0, "NuminaMath": 0.6}
NUMINA_CAP, NUMINA_FLOOR, NUMINA_CAPPED_SHARE = 4000, 800, 0.9

# Tables 14 (RTX PRO 6000) and 15 (H200), Qwen3-8B: the grid's best (token budget B, batch cap N) per scheduler
BEST_CONFIG: dict[str, dict[str, dict[str, tuple[int, int]]]] = {
    "RTX-PRO-6000": {"ShareGPT": {"v0": (14336, 1536), "v1": (16384, 1536), "eb": (14336, 1536)},
                     "LongBench": {"v0": (16384, 512), "v1": (10240, 1024), "eb": (16384, 512)},
                     "NuminaMath": {"v0": (8192, 256), "v1": (14336, 256), "eb": (4096, 256)}},
    "H200": {"ShareGPT": {"v0": (18432, 2048), "v1": (10240, 1024), "eb": (16384, 1536)},
             "LongBench": {"v0": (18432, 256), "v1": (14336, 256), "eb": (14336, 2048)},
             "NuminaMath": {"v0": (10240, 256), "v1": (14336, 256), "eb": (18432, 256)}},
}
# Section 4.3.3 (the TPOT of Figure 5 quoted in the text), Qwen3-8B, ms: the same runs as Table 2
TPOT_MS: dict[str, dict[str, dict[str, float]]] = {
    "RTX-PRO-6000": {"ShareGPT": {"v1": 268.97, "eb": 93.68}, "NuminaMath": {"v1": 81.75, "eb": 65.22}},
    "H200": {"NuminaMath": {"v1": 31.03, "eb": 26.87}},
}


@functools.cache
def data() -> dict:
    return json.loads(resources.files("ebctl.data").joinpath("paper_measurements.json").read_text())


def _clipped(dist, lo: float, hi: float) -> tuple[float, float]:
    """Mean and σ of min(max(X, lo), hi) for X ~ ``dist``."""
    f_lo, s_hi = dist.cdf(lo), dist.sf(hi)
    m1 = lo * f_lo + dist.expect(lambda x: x, lb=lo, ub=hi) + hi * s_hi
    m2 = lo * lo * f_lo + dist.expect(lambda x: x * x, lb=lo, ub=hi) + hi * hi * s_hi
    return m1, float(np.sqrt(max(m2 - m1 * m1, 0.0)))


@functools.cache
def output_gamma(mean: float, sd: float, lo: float, hi: float) -> tuple[float, float]:
    """(shape, scale) of the Gamma whose clipping to [lo, hi] has this mean and σ."""

    def err(z: np.ndarray) -> np.ndarray:
        k, theta = np.exp(z)
        m, s = _clipped(stats.gamma(k, scale=theta), lo, hi)
        return np.array([m / mean - 1.0, s / sd - 1.0])

    k0 = (mean / sd) ** 2
    sol = optimize.least_squares(err, np.log([k0, mean / k0]), xtol=1e-12, ftol=1e-12)
    if np.max(np.abs(sol.fun)) > 1e-3:
        raise ValueError(f"no Gamma clipped to [{lo}, {hi}] has mean {mean} and σ {sd}")
    k, theta = np.exp(sol.x)
    return float(k), float(theta)


@functools.cache
def input_lognormal(mean: float, log_sigma: float, lo: float, hi: float) -> float:
    """The log-location μ of the lognormal(μ, log_sigma) whose clipping to [lo, hi] has this mean."""

    def err(mu: float) -> float:
        return _clipped(stats.lognorm(log_sigma, scale=np.exp(mu)), lo, hi)[0] - mean

    return float(optimize.brentq(err, np.log(lo) - 5 * log_sigma, np.log(hi) + 5 * log_sigma))


def _draw(dist, lo: float, hi: float, n: int, rng: np.random.Generator) -> np.ndarray:
    return np.clip(np.rint(dist.rvs(size=n, random_state=rng)), lo, hi).astype(np.int64)


def table9(name: str, n: int, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, outputs) of ``n`` requests with the statistics of Table 9's ``name`` (module docstring)."""
    w = data()["table9_workloads"][name]
    rng = np.random.default_rng(seed)
    lo, hi = w["input_range"]
    if name in INPUT_LOG_SIGMA:
        sig = INPUT_LOG_SIGMA[name]
        mu = input_lognormal(w["input_mean"], sig, lo, hi)
        inputs = _draw(stats.lognorm(sig, scale=np.exp(mu)), lo, hi, n, rng)
    else:
        inputs = rng.integers(lo, hi + 1, size=n)
    olo, ohi = w["output_range"]
    k, theta = output_gamma(w["output_mean"], w["output_sd"], olo, ohi)
    outputs = _draw(stats.gamma(k, scale=theta), olo, ohi, n, rng)
    return inputs.astype(np.int64), outputs


def served(name: str, n: int, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, outputs) of ``n`` requests as the paper served workload ``name``: Table 9's, except NuminaMath's
    outputs (the module docstring: a share at the cap, the rest uniform from the floor to the cap)."""
    inputs, outputs = table9(name, n, seed=seed)
    if name == "NuminaMath":
        rng = np.random.default_rng(seed + 1)
        spread = rng.integers(NUMINA_FLOOR, NUMINA_CAP + 1, size=n)
        outputs = np.where(rng.random(n) < NUMINA_CAPPED_SHARE, NUMINA_CAP, spread).astype(np.int64)
    return inputs, outputs
