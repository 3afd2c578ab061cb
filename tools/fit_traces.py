"""Fit the output-length hazard of the shipped traces and evaluate the closed forms on them.

For each trace (whole trace as the window): p̂0, η̂ (WLS over [1, t95], Section 3.4), μ̂_L, μ̂_O; then,
with a cost profile and the KV capacity C of that model on that GPU (vLLM's arithmetic, ebctl.sim.hardware),
θ̂0 (Eq. 3), Δθ (Eq. 5, iterated with N̂* as the controller's cycles do), θ̂* clipped to [0.01, 0.8], N̂* (Eq. 6,
ε = 0.01) capped at 1,024, and the exact-fluid θ for comparison. Run: python tools/fit_traces.py
"""

from __future__ import annotations

import argparse

from ebctl import model, profiles
from ebctl.estimate import fit_hazard
from ebctl.sim import hardware, workloads

THETA_MIN, THETA_MAX, EPS, N_CAP = 0.01, 0.80, 0.01, 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--profiles", default="qwen3-8b/h200,qwen3-8b/rtx-pro-6000")
    a = ap.parse_args()
    print("| trace | p̂0 | η̂ (η̂/se) | μ̂_L | μ̂_O | profile | C (tokens) | θ̂0 | Δθ | θ̂* | N̂* | k̂* | exact-fluid θ |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in workloads.TRACES:
        inputs, outputs, _ = workloads.read_rows(workloads.trace_path(name))
        hz = fit_hazard(outputs)
        mu_l = float(inputs.mean())
        for pname in a.profiles.split(","):
            prof = profiles.load(pname)
            c = prof.costs
            cap = hardware.kv_capacity_tokens(prof.model, prof.gpu)
            theta0 = model.theta0(hz.p0 * c.alpha_p / c.alpha_d)
            n, theta = N_CAP, theta0
            for _ in range(20):  # Algorithm 1's one-step fixed point: Δθ at the previous N̂*
                dt = model.delta_theta(theta0, hz.p0, hz.eta, c.alpha_d, c.beta_d, n) if hz.eta > 0 else 0.0
                theta = min(max(theta0 + dt, THETA_MIN), THETA_MAX)
                n_new = min(model.n_star(cap, EPS, theta, hz.p0, mu_l), N_CAP)
                if n_new == n:
                    break
                n = n_new
            fluid = model.theta_exact_fluid(hz.p0, hz.eta, c.alpha_p, c.beta_p, c.alpha_d, c.beta_d, mu_l, n)
            print(f"| {name} | {hz.p0:.3g} | {hz.eta:+.3g} ({hz.eta / hz.eta_se:+.0f}) | {mu_l:.0f} | {hz.mu_o:.0f} "
                  f"| {pname} | {cap:,} | {theta0:.4f} | {dt:+.3f} | {theta:.3f} | {n} | {max(1, int(theta * n))} "
                  f"| {fluid:.3f} |")


if __name__ == "__main__":
    main()
