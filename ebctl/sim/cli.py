"""``ebctl simulate``: run policies on the simulated engine and compare them (table, JSON, plot).

``simulate`` is a plain function with typer-annotated parameters; the main CLI registers it with
``app.command("simulate")(simulate)`` and ``python -m ebctl.sim`` runs it alone.
"""

from __future__ import annotations

import json
import math
import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ebctl import profiles
from ebctl.sim import costs, hardware, policies, runner, workloads
from ebctl.sim.engine import EngineConfig
from ebctl.sim.metrics import jsonable

DEFAULT_POLICIES = "v0,mb,eb-auto,eb+"


def _fail(msg: str) -> typer.Exit:
    Console(stderr=True).print(f"[red]error:[/red] {escape(msg)}", highlight=False)
    return typer.Exit(2)


def simulate(
    profile: Annotated[str, typer.Option(help="Cost profile: a preset (qwen3-8b/h200, "
                                              "qwen3-8b/rtx-pro-6000, ...) or a profile file.")] = "qwen3-8b/h200",
    workload: Annotated[str | None, typer.Option(
        help="balanced, decode-heavy, prefill-heavy, table3, azure-conv, azure-code, mooncake-conv, "
             "dist-shift, conc-shift, uniform:L=..,O=.., geometric:L=..,O=.., gamma:a=..,L=..,O=..")] = None,
    trace: Annotated[Path | None, typer.Option(help="A trace CSV (input_tokens,output_tokens[,timestamp_s|"
                                                    "timestamp_ms] or Azure's TIMESTAMP,ContextTokens,"
                                                    "GeneratedTokens).")] = None,
    concurrency: Annotated[int, typer.Option(help="Closed loop: requests outstanding at most.")] = 2048,
    open_loop: Annotated[bool, typer.Option("--open-loop", help="Replay the trace's timestamps instead.")] = False,
    time_scale: Annotated[float, typer.Option(help="Open loop: inter-arrival times × this.")] = 1.0,
    requests: Annotated[int, typer.Option(help="Requests per run.")] = 4000,
    policy_list: Annotated[str, typer.Option("--policies", help="Comma-separated: v0, mb, eb:k=K, eb:theta=X, "
                                                                "eb-auto, eb+, default, sglang:min-free-slots=K, "
                                                                "sglang:pd-interval=N; a policy's options follow "
                                                                "its colon, comma-separated too: "
                                                                "v0,eb:theta=0.3,n=300.")] = DEFAULT_POLICIES,
    sweep_theta: Annotated[bool, typer.Option("--sweep-theta", help="Add eb:theta=X for X in 0.05..0.95, each at "
                                              "the batch cap of --sweep-n.")] = False,
    sweep_n: Annotated[int, typer.Option(help="--sweep-theta's batch cap N (k = ⌊θN⌋); 0: Eq. 6's N̂* at each θ, "
                                              "as the controller computes it from the workload's lengths (at the "
                                              "engine's slots EB is stock wherever the KV cache fills first).")] = 0,
    sweep_static: Annotated[bool, typer.Option("--sweep-static", help="Add what sglang ships instead of a "
                                               "controller: v0, mb, sglang:min-free-slots=K (K = 2, 4, ... up to "
                                               "half the slots), sglang:pd-interval=N (N = 1, 2, 4, ... 32); the "
                                               "best of them is printed beside the others.")] = False,
    seed: Annotated[int, typer.Option(help="Workload sampling seed (the engine is deterministic).")] = 0,
    engine_rules: Annotated[str, typer.Option(help="Whose scheduler: sglang (0.5.23, the engine ebctl steers) "
                                                   "or vllm (V0 stock / v1 mixed, the paper's).")] = "sglang",
    max_running: Annotated[int, typer.Option(help="Engine slots N (--max-running-requests).")] = 1024,
    token_budget: Annotated[int, typer.Option(help="Tokens per iteration B (--chunked-prefill-size).")] = 8192,
    kv_tokens: Annotated[int, typer.Option(help="KV capacity C in tokens (--max-total-tokens); 0: the "
                                                "profile's engine, else from the model and GPU.")] = 0,
    block_size: Annotated[int, typer.Option(help="KV page in tokens; 0: the rules' (sglang 1, vLLM 16).")] = 0,
    mixed_chunk: Annotated[bool, typer.Option("--mixed-chunk", help="Launch with mixed chunks (sglang "
                                              "--enable-mixed-chunk; vllm: v1): what v0 runs.")] = False,
    max_new_tokens: Annotated[int, typer.Option(help="sglang: 0 = requests carry their output length with "
                                                     "ignore_eos; N = max_new_tokens N, stopping at EOS.")] = 0,
    cost_model: Annotated[str, typer.Option(help="profile (what the profile carries for the simulator), "
                                                 "iteration (its forward-pass fit) or linear (the paper's)."
                                            )] = "profile",
    layers: Annotated[int, typer.Option(help="Layers for the attention terms; 0: the model's (Qwen3-8B: 36).")] = 0,
    slo_ttft: Annotated[float, typer.Option(help="Goodput SLO: TTFT seconds (MLPerf's server limit).")] = 2.0,
    slo_tpot: Annotated[float, typer.Option(help="Goodput SLO: TPOT seconds (MLPerf's server limit for "
                                                 "Llama-3.1-8B).")] = 0.1,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    plot: Annotated[Path | None, typer.Option(help="Draw throughput vs θ and the eb+ mode over time "
                                                   "(needs matplotlib).")] = None,
    progress: Annotated[bool, typer.Option(help="Progress bar on a terminal.")] = True,
    dp: Annotated[int, typer.Option(help="Data-parallel ranks: simulate dispatch over N ranks (ebctl.sim.dp) "
                                         "instead of one engine; 0: off.")] = 0,
    dispatch: Annotated[str, typer.Option(help="--dp: comma-separated dispatch policies: round-robin, "
                                               "total-tokens (sglang's), sbs.")] = "round-robin,total-tokens,sbs",
    dp_mode: Annotated[str, typer.Option(help="--dp: attention (DP+EP, ranks in lockstep) or plain.")] = "attention",
    instances: Annotated[int, typer.Option(help="--dp with attention: lockstep instances of N ranks each behind "
                                                "one dispatcher (the SBS paper: 3).")] = 1,
    rate: Annotated[float, typer.Option(help="--dp: Poisson arrivals per second; 0: the trace's timestamps.")] = 0.0,
    chunk: Annotated[int, typer.Option(help="--dp: prefill tokens per rank and forward.")] = 3072,
    dp_profile: Annotated[str, typer.Option(help="--dp: dpep (DeepSeek-V3 DP+EP: qwen3-30b-a3b/h200 scaled, "
                                                 "calibrated to the SBS paper), dpep-compute (not "
                                                 "calibrated) or a profile name, unscaled.")] = "dpep",
) -> None:
    """Simulate an engine under each policy on one workload and compare throughput and latency."""
    if plot is not None and not _has_matplotlib():
        raise _fail("--plot needs matplotlib: pip install 'ebctl[plot]'")
    if workload is not None and trace is not None:
        raise _fail("give --workload or --trace, not both")
    if dp:
        from ebctl.sim.dp.cli import simulate_dp
        try:
            simulate_dp(dp=dp, instances=instances, dispatch_list=dispatch, mode=dp_mode, rate=rate, chunk=chunk,
                        profile=dp_profile, workload=workload, trace=str(trace) if trace else None,
                        requests=requests, seed=seed, time_scale=time_scale, json_out=json_out, command=_command_line())
        except (ValueError, OSError, profiles.ProfileError) as e:
            raise _fail(str(e)) from None
        return
    try:
        prof = profiles.load(profile)
        cm = costs.build(prof, cost_model, layers=layers or None)
        sim_engine = (getattr(prof, "sim", None) or {}).get("engine", {})
        kv = kv_tokens or int(sim_engine.get("kv_tokens", 0)) or hardware.kv_capacity_tokens(prof.model, prof.gpu)
        cfg = EngineConfig(rules=engine_rules, max_running=max_running, token_budget=token_budget, kv_tokens=kv,
                           block_size=block_size, mixed_chunk=mixed_chunk, max_new_tokens=max_new_tokens)
        if trace is not None:
            wl = workloads.from_trace(trace, requests, seed=seed, open_loop=open_loop, time_scale=time_scale)
        else:
            wl = workloads.load(workload or "balanced", requests, seed=seed, open_loop=open_loop,
                                time_scale=time_scale)
        specs = policies.split_specs(policy_list)
        caps: list[int] = []
        if sweep_theta:
            if not 0 <= sweep_n <= cfg.max_running:
                raise ValueError(f"--sweep-n {sweep_n}: must be in [0, --max-running {cfg.max_running}]")
            caps = ([sweep_n] * len(policies.theta_grid()) if sweep_n else
                    policies.eq6_caps(policies.theta_grid(), input_len=wl.input_len, output_len=wl.output_len,
                                      kv_tokens=kv, max_running=cfg.max_running))
            specs += [s for s in policies.theta_sweep(n=caps) if s not in specs]
        if sweep_static:
            specs += [s for s in policies.static_sweep(cfg.max_running) if s not in specs]
        if not specs:
            raise ValueError("no policies given")
        for s in specs:  # parse them all before running any; a knob's flags must suit the engine's rules
            src = policies.make(s, max_running=cfg.max_running, kv_tokens=kv, costs=prof.costs, profile=prof)
            if src.engine and cfg.rules != "sglang":
                raise ValueError(f"policy {s!r} sets sglang's own flags: --engine-rules sglang only")
        if concurrency < 1:
            raise ValueError(f"--concurrency {concurrency}: must be >= 1")
    except (ValueError, OSError, profiles.ProfileError) as e:
        raise _fail(str(e)) from None

    err = Console(stderr=True)
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=err, transient=True, disable=not (progress and err.is_terminal))
    results = []
    with bar:
        for spec in specs:
            task = bar.add_task(f"{spec:>14}", total=len(wl))
            src = policies.make(spec, max_running=cfg.max_running, kv_tokens=kv, costs=prof.costs, profile=prof)
            res = runner.run(wl, src, cm, cfg, concurrency=concurrency, slo=runner.Slo(slo_ttft, slo_tpot),
                             progress=lambda done, total, t=task: bar.update(t, completed=done))
            bar.remove_task(task)
            results.append(res)

    header = {"command": _command_line(),
              "profile": prof.name, "workload": wl.name, "requests": len(wl),
              "concurrency": wl.concurrency_label(concurrency),
              "engine": {"rules": cfg.rules, "max_running": cfg.max_running, "token_budget": cfg.token_budget,
                         "kv_tokens": cfg.kv_tokens, "block_size": cfg.page, "mixed_chunk": cfg.mixed_chunk},
              "cost_model": costs.describe(cm), "best_fixed_theta": best_theta(results),
              "best_static": best_static(results),
              "slo": {"ttft_s": slo_ttft, "tpot_s": slo_tpot},
              "winners": winners(results), "notes": notes(results, slo_ttft, slo_tpot)}
    if sweep_theta:
        header["sweep"] = {"n": sweep_n or "eq6", "caps": dict(zip(policies.theta_grid(), caps, strict=True))}
    if json_out:
        print(json.dumps(jsonable({**header, "results": results})))
    else:
        out = Console()
        render(header, results, out if out.is_terminal else Console(width=200))
    if plot is not None:
        draw(results, plot, title=f"{prof.name} · {wl.name} · c={header['concurrency']}")


def _command_line() -> str:
    args = sys.argv[1:]
    if args[:1] == ["simulate"]:
        return "ebctl " + shlex.join(args)
    return "python -m ebctl.sim " + shlex.join(args)


def best_theta(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The best ``eb:theta=X`` run by throughput, and each other policy's throughput as a share of it."""
    fixed = [r for r in results if policies.fixed_theta(r["policy"]) is not None]
    if not fixed:
        return None
    best = max(fixed, key=lambda r: r["total_tok_per_s"])
    return {"policy": best["policy"], "theta": policies.fixed_theta(best["policy"]),
            "total_tok_per_s": best["total_tok_per_s"],
            "share": {r["policy"]: r["total_tok_per_s"] / best["total_tok_per_s"]
                      for r in results if policies.fixed_theta(r["policy"]) is None}}


def best_static(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Among what sglang alone can be set to (``policies.is_static``), the best by output tok/s and the best by
    goodput (output tok/s of the requests within the SLO), and each other run's share of them; None unless
    both kinds ran."""
    static = [r for r in results if policies.is_static(r["policy"])]
    auto = [r for r in results if not policies.is_static(r["policy"])]
    if not static or not auto:
        return None
    out: dict[str, Any] = {}
    for key in ("tok_per_s", "goodput_tok_per_s"):
        best = max(static, key=lambda r: _get(r, (key,)) if math.isfinite(_get(r, (key,))) else -math.inf)
        v = _get(best, (key,))
        out[key] = {"policy": best["policy"], "value": v,
                    "share": {r["policy"]: _get(r, (key,)) / v if v > 0 else math.nan for r in auto}}
    return out


def _schedule(r: dict[str, Any]) -> tuple:
    """What identifies a run's schedule: the engine is deterministic, so equal schedules give equal numbers."""
    steps = tuple(sorted((r.get("steps") or {}).items()))
    return r.get("makespan_s"), r.get("tokens_out"), r.get("preemptions"), steps


def _stock(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((r for r in results if r["policy"] in ("v0", "stock")), None)


# (what, key path, better: +1 higher / -1 lower)
MEASURES = (("output tok/s", ("tok_per_s",), 1), ("TTFT p50", ("ttft_s", "p50"), -1),
            ("TTFT p99", ("ttft_s", "p99"), -1), ("TPOT p99", ("tpot_s", "p99"), -1),
            ("ITL p99", ("itl_s", "p99"), -1), ("stall p99", ("max_gap_s", "p99"), -1),
            ("goodput", ("goodput_frac",), 1))


def _get(r: dict[str, Any], path: tuple[str, ...]) -> float:
    x: Any = r
    for k in path:
        x = x.get(k) if isinstance(x, dict) else None
    return float(x) if isinstance(x, int | float) and math.isfinite(x) else math.nan


def winners(results: list[dict[str, Any]], rel: float = 1e-9) -> list[dict[str, Any]]:
    """Per measure, the policies that do best (ties within ``rel`` all named) and their value; the fixed-θ
    rows of a sweep are left out unless nothing else ran."""
    pool = [r for r in results if policies.fixed_theta(r["policy"]) is None] or results
    out = []
    for what, path, sign in MEASURES:
        vals = [(r["policy"], _get(r, path)) for r in pool]
        vals = [(p, v) for p, v in vals if math.isfinite(v)]
        if not vals:
            continue
        best = max(sign * v for _, v in vals)
        out.append({"measure": what, "value": sign * best,
                    "policies": [p for p, v in vals if sign * v >= best - rel * max(abs(best), 1e-300)]})
    return out


def notes(results: list[dict[str, Any]], slo_ttft: float, slo_tpot: float) -> list[str]:
    """Plain words for two results that look like bugs and are not: a θ sweep equal to stock, and goodput
    near 0 for every policy."""
    out = []
    fixed = [r for r in results if policies.fixed_theta(r["policy"]) is not None]
    stock = _stock(results)
    if len(fixed) > 1 and len({_schedule(r) for r in fixed}) == 1:
        same = (f"equals {stock['policy']}'s (stock) schedule exactly" if stock is not None
                and _schedule(stock) == _schedule(fixed[0]) else "gives the same schedule")
        running = f" (stock ran {stock['mean_running']:.0f} on average)" if stock and "mean_running" in stock else ""
        out.append(f"every eb:theta row {same}: θ changed nothing, because the batch cap N never filled before "
                   f"the KV cache did{running}, so each refill ran on and k never held a prefill back. Give "
                   "--sweep-n a cap below the batch the KV cache holds, or 0 for Eq. 6's N̂*.")
    elif stock is not None and fixed:
        same = [r["policy"] for r in fixed if _schedule(r) == _schedule(stock)]
        if same:
            out.append(f"{', '.join(same)} equal {stock['policy']} (stock) exactly: at that cap the KV cache fills "
                       "before the slots do, so each refill ran on and k never held a prefill back.")
    good = [r.get("goodput_frac", math.nan) for r in results]
    if results and all(math.isfinite(g) and g <= 0.01 for g in good):
        ttft = max((r.get("ttft_slo_frac", math.nan) for r in results), default=math.nan)
        tpot = max((r.get("tpot_slo_frac", math.nan) for r in results), default=math.nan)
        why = [f"goodput ≤ 1% for every policy: at most {ttft:.0%} of requests met TTFT ≤ {slo_ttft:g} s and "
               f"{tpot:.0%} TPOT ≤ {slo_tpot * 1e3:g} ms"]
        if stock is not None and isinstance(stock.get("concurrency"), int) and stock.get("req_per_s"):
            c, running = stock["concurrency"], stock.get("mean_running", math.nan)
            if math.isfinite(running) and c > running + 1:
                wait = (c - running) / stock["req_per_s"]
                why.append(f"the client keeps {c} requests outstanding and stock runs {running:.0f} at once, so "
                           f"{c - running:.0f} queue for about {wait:.1f} s each at {stock['req_per_s']:.2f} req/s "
                           f"(Little's law): no TTFT objective under ~{wait:.0f} s can be met at this load, whatever "
                           f"the policy; --concurrency {running:.0f} or less measures latency below saturation")
        out.append("; ".join(why) + ".")
    return out


def _f(x: float, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x * scale:,.{digits}f}"


def _vs(r: dict[str, Any], stock: dict[str, Any] | None) -> str:
    """Output tok/s, with its change on stock's where a stock row ran."""
    text = _f(r["tok_per_s"], digits=0)
    if stock is not None and r is not stock and stock.get("tok_per_s"):
        text += f" {r['tok_per_s'] / stock['tok_per_s'] - 1:+.1%}"
    return text


def _share(r: dict[str, Any], key: str) -> str:
    x = r.get(key)
    return f"{x:.0%}" if isinstance(x, int | float) and math.isfinite(x) else "-"


def _winner_text(w: dict[str, Any]) -> str:
    what, v = w["measure"], w["value"]
    value = (f"{v:,.0f}" if what == "output tok/s" else f"{v:.0%}" if what == "goodput"
             else f"{v:.2f} s" if what.startswith("TTFT") else f"{v * 1e3:,.1f} ms")
    if what == "goodput" and v <= 0:
        return "goodput: none met the SLO"
    return f"{what}: {', '.join(w['policies'])} ({value})"


def render(header: dict[str, Any], results: list[dict[str, Any]], console: Console) -> None:
    """The table (throughput and latency side by side, led by the policy, split into parts on a narrow terminal),
    then the SLO, which policy wins on which measure, and notes."""
    stock = _stock(results)
    cols = ("policy", "out tok/s", "TTFT p50/p99 s", "TPOT p50/p99 ms", "ITL p99 ms", "stall p50/p99 ms", "goodput",
            "SLO met TTFT/TPOT", "total tok/s", "req/s", "preempt", "peak KV", "mode / k·N")
    rows = [(r["policy"], _vs(r, stock), f"{_f(r['ttft_s']['p50'])}/{_f(r['ttft_s']['p99'])}",
             f"{_f(r['tpot_s']['p50'], 1e3, 1)}/{_f(r['tpot_s']['p99'], 1e3, 1)}",
             _f(r["itl_s"]["p99"], 1e3, 1),
             f"{_f(_get(r, ('max_gap_s', 'p50')), 1e3, 0)}/{_f(_get(r, ('max_gap_s', 'p99')), 1e3, 0)}",
             f"{r['goodput_frac']:.0%}",
             f"{_share(r, 'ttft_slo_frac')}/{_share(r, 'tpot_slo_frac')}", _f(r["total_tok_per_s"], digits=0),
             _f(r["req_per_s"]), str(r["preemptions"]), f"{r['peak_kv_frac']:.0%}", _modes(r)) for r in results]

    def table(title: str, idx: list[int]) -> Table:
        t = Table(title=title, title_justify="left")
        for i in idx:
            t.add_column(cols[i], justify="left" if i in (0, len(cols) - 1) else "right", no_wrap=True)
        for row in rows:
            t.add_row(*(row[i] for i in idx))
        return t

    # Narrower than the table: split its columns into tables that fit, each led by the policy (never cut).
    parts, cur = [], [0]
    for i in range(1, len(cols)):
        natural = console.measure(table("", [*cur, i]), options=console.options.update_width(10_000)).maximum
        if len(cur) > 1 and natural > console.width:
            parts, cur = [*parts, cur], [0]
        cur.append(i)
    title = f"{header['profile']} · {header['workload']} · {header['requests']} requests · c={header['concurrency']}"
    for n, idx in enumerate([*parts, cur]):
        console.print(table(title if n == 0 else "", idx))
    slo = header.get("slo")
    if slo:
        console.print(f"goodput: the share of requests with TTFT ≤ {slo['ttft_s']:g} s and TPOT ≤ "
                      f"{slo['tpot_s'] * 1e3:g} ms (--slo-ttft, --slo-tpot; default: MLPerf's server limits for "
                      "Llama-3.1-8B); SLO met: each objective alone; stall: each request's longest gap between "
                      "two of its tokens", highlight=False)
    if header.get("winners") and len(results) > 1:
        console.print("best · " + " · ".join(_winner_text(w) for w in header["winners"]), highlight=False)
    static = header.get("best_static")
    if static:
        t, g = static["tok_per_s"], static["goodput_tok_per_s"]
        console.print(f"best static setting · output tok/s: {t['policy']} ({t['value']:,.0f}); the controller's share "
                      f"of it: {', '.join(f'{k} {v:.1%}' for k, v in t['share'].items())} · goodput: {g['policy']} "
                      f"({g['value']:,.0f} tok/s of requests within the SLO); the controller's share: "
                      f"{', '.join(f'{k} {v:.1%}' if math.isfinite(v) else f'{k} -' for k, v in g['share'].items())}",
                      highlight=False)
    best = header.get("best_fixed_theta")
    if best:
        shares = ", ".join(f"{k} {v:.1%}" for k, v in best["share"].items())
        console.print(f"best fixed θ = {best['theta']:.2f} ({best['policy']}, {best['total_tok_per_s']:,.0f} tok/s); "
                      f"share of it: {shares}", highlight=False)
    for note in header.get("notes") or ():
        console.print(f"note: {note}", highlight=False)


def _modes(r: dict[str, Any]) -> str:
    share = r.get("mode_share") or {}
    text = " ".join(f"{k} {v:.0%}" for k, v in sorted(share.items()) if v >= 0.005 and len(share) > 1)
    fp = r.get("final_policy")
    if fp:
        text += f" k={fp['k']} N={fp['n_max']}"
    return text.strip() or ("stock" if not share else next(iter(share)))


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def draw(results: list[dict[str, Any]], path: Path, *, title: str = "") -> None:
    """Throughput vs θ (with every other policy as a line) and the eb+ mode over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = sorted((policies.fixed_theta(r["policy"]), r["total_tok_per_s"]) for r in results
                   if policies.fixed_theta(r["policy"]) is not None)
    plus = [r for r in results if r["policy"].startswith("eb+")]
    fig, axes = plt.subplots(1, 2 if plus else 1, figsize=(12 if plus else 7, 4), squeeze=False)
    ax = axes[0][0]
    if sweep:
        ax.plot([s[0] for s in sweep], [s[1] for s in sweep], "o-", label="eb:theta=X")
    for i, r in enumerate(r for r in results if policies.fixed_theta(r["policy"]) is None):
        ax.axhline(r["total_tok_per_s"], color=f"C{i + 1}", ls="--", label=r["policy"])
    ax.set_xlabel("θ = k/N")
    ax.set_ylabel("total tokens/s")
    ax.set_title(title)
    ax.legend(fontsize=8)
    if plus:
        ax2 = axes[0][1]
        level = {"off": 0.5, "mb": 0.0, "eb": 1.0}
        for r in plus:
            tl = r["mode_timeline"]
            if tl:
                xs = [c[0] for c in tl] + [r["makespan_s"]]
                ys = [level.get(c[1], 0.5) for c in tl] + [level.get(tl[-1][1], 0.5)]
                ax2.step(xs, ys, where="post", label=r["policy"])
        ax2.set_yticks([0, 0.5, 1], ["mb", "off", "eb"])
        ax2.set_xlabel("simulated time (s)")
        ax2.set_title("eb+ mode")
        ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    app = typer.Typer(add_completion=False)
    app.command()(simulate)
    app()
