"""``ebctl ab [OPTIONS] -- <sglang launch_server arguments>``: the user's A/B on their own server. Parses the
options, builds the sitting's ``Plan``, runs it, writes the record, the report and the picture, pools. Exit
codes: 0 every run finished without a failed request, 1 a run failed to start or a request failed, 2 a bad
option, configuration, trace or dataset (named), 130 interrupted (every server stopped, the partial record
written)."""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from ebctl.ab import configs, stats, workloads

DESCRIPTION = "The A/B on your own server: sglang alone, its flags and ebctl, interleaved, each run fresh."
EPILOG = """Give sglang's launch arguments after --, as you serve: ebctl ab --configs alone,ebctl --runs 3
--duration 600 -- --model-path Qwen/Qwen3-8B --tp 1. Every run starts that server fresh (ebctl's from a cold
start), loads it, stops it; the rounds run every configuration once, in rotated order. --cpu-demo runs the same
on the tiny CPU model of a checkout (no GPU needed). docs/ab.md: which configurations to compare, how long, how
to read the interval."""


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ebctl ab", description=DESCRIPTION, epilog=EPILOG, allow_abbrev=False,
                                 usage="ebctl ab [OPTIONS] -- <sglang launch_server arguments>")
    a = ap.add_argument
    a("--configs", default="alone,ebctl", help="comma-separated: alone, mixed, mfsd=K, pdi=N, ebctl, plugin, "
      "HEAD:ITEM;ITEM... (docs/ab.md; default alone,ebctl)")
    a("--baseline", default=None, help="the configuration ratios are to (default: the first)")
    a("--runs", type=int, default=None, help="rounds; each runs every configuration once (default 3)")
    a("--duration", type=float, default=None, help="seconds of load per run (default 480)")
    a("--last", type=float, default=None, help="the last part's length in s, for its throughput (default 240)")
    a("--drain", type=float, default=120.0, help="seconds to wait for the requests in flight at the end")
    a("--order", choices=("rotate", "given"), default="rotate", help="each round's order (default rotate)")
    a("--loop", choices=("closed", "open"), default=None,
      help="closed: --concurrency always in flight; open: Poisson arrivals at --rate (default: open if --rate)")
    a("--concurrency", type=int, default=24, help="closed loop: requests always in flight (default 24)")
    a("--rate", type=float, default=None, help="open loop: requests per second (Poisson arrivals)")
    a("--trace", default=None, help="a trace CSV or an `ebctl simulate` workload name (default: the issue's)")
    a("--dataset", choices=workloads.DATASETS, default=None, help="sglang bench_serving's dataset, for its "
      "lengths: random/random-ids (--random-*), sharegpt or mooncake (--dataset-path: a local file)")
    a("--dataset-path", default=None, help="the local ShareGPT JSON or Mooncake JSONL")
    a("--random-input-len", type=int, default=1024)
    a("--random-output-len", type=int, default=1024)
    a("--random-range-ratio", type=float, default=0.0)
    a("--requests", type=int, default=480, help="(input, output) pairs, cycled in order (default 480)")
    a("--seed", type=int, default=0, help="lengths' seed; prompts use seed and run number")
    a("--slo", default=None, metavar="TTFT,TPOT", help="targets in seconds, e.g. 1.0,0.05: adds goodput")
    a("--status-every", type=float, default=None, help="seconds between ebctl status reads (default 60)")
    a("--server-args", default="", help="sglang flags added for every configuration (write it with =)")
    a("--pin", action=argparse.BooleanOptionalAction, default=None,
      help="the scheduler's main thread alone on CPU 0 (the CPU VM's placement; default: only with --cpu-demo)")
    a("--python", default=None, help="the Python with sglang (default: this one; --cpu-demo: its venv's)")
    a("--vocab", type=int, default=None, help="the model's vocabulary size (default: read from the model)")
    a("--ready-timeout", type=float, default=900.0, help="seconds a server may take to be ready")
    a("--json", type=Path, default=None, help="the record (default: ab.json in the workdir)")
    a("--report", type=Path, default=None, help="the markdown report (default: ab.md in the workdir)")
    a("--png", type=Path, default=None, help="the picture (default: ab.png in the workdir; needs matplotlib)")
    a("--pool", type=Path, default=None, metavar="FILE.jsonl",
      help="append this sitting to FILE.jsonl and print every sitting there pooled")
    a("--workdir", type=Path, default=None, help="logs and runtime dirs (default: a temporary one)")
    a("--quick", action="store_true", help="alone,ebctl, 1 round, 45 s, --last 20, status every 15 s")
    a("--from-json", type=Path, default=None, help="run nothing: report a recorded sitting (with --slo, --png)")
    a("--cpu-demo", action="store_true", help="the tiny CPU model of a checkout, its CPU flags and pinning")
    a("--venv", default=None, help="--cpu-demo: the sglang CPU environment (default: tools/sglang_env.sh's)")
    a("--model", type=Path, default=None, help="--cpu-demo: a tiny model already built (default: build one)")
    a("launch", nargs=argparse.REMAINDER, help="-- then sglang's launch_server arguments")
    return ap


def defaults(a: argparse.Namespace) -> None:
    """Fill what the command line left open (``--quick``'s shorter run)."""
    for key, full, quick in (("runs", 3, 1), ("duration", 480.0, 45.0), ("last", 240.0, 20.0),
                             ("status_every", 60.0, 15.0)):
        if getattr(a, key) is None:
            setattr(a, key, quick if a.quick else full)
    a.loop = a.loop or ("open" if a.rate else "closed")
    a.pin = a.cpu_demo if a.pin is None else a.pin
    a.launch = a.launch[1:] if a.launch[:1] == ["--"] else a.launch


def check(a: argparse.Namespace) -> None:
    """ValueError naming the option for what cannot run."""
    if not (a.duration > 0 and a.status_every > 0 and a.runs >= 1 and a.concurrency >= 1 and a.requests >= 1):
        raise ValueError("--duration, --status-every, --runs, --concurrency and --requests must be positive")
    if a.loop == "open" and not a.rate:
        raise ValueError("--loop open needs --rate (requests per second)")
    if a.rate is not None:
        workloads.poisson_arrivals(a.rate, 0.0)  # checks the rate
    if a.trace and a.dataset:
        raise ValueError("give --trace or --dataset, not both")
    if a.dataset in ("sharegpt", "mooncake") and not a.dataset_path:
        raise ValueError(f"--dataset {a.dataset} needs --dataset-path: a local file (nothing is downloaded)")
    if not a.cpu_demo and not a.from_json and not serve_option(a.launch, "--model-path"):
        raise ValueError("give sglang's launch arguments after --, with --model-path (or use --cpu-demo)")
    a.last = min(a.last, a.duration)


def serve_option(args: list[str], name: str) -> str | None:
    """A launch argument's value (``--model-path`` also as sglang's alias ``--model``)."""
    from ebctl.ab.serve import option

    return option(args, name) or (option(args, "--model") if name == "--model-path" else None)


def lengths(a: argparse.Namespace, python: str, model: str) -> tuple[list[tuple[int, int]], str, dict[str, Any]]:
    """(pairs, the workload's name, what the model probe said) for the options given."""
    seen: dict[str, Any] = {}
    if a.trace:
        from ebctl.sim import workloads as sim

        wl = sim.load(a.trace, a.requests, seed=a.seed)
        return [(int(i), int(o)) for i, o in zip(wl.input_len, wl.output_len, strict=True)], a.trace, seen
    if a.dataset in ("random", "random-ids"):
        return (workloads.random_lengths(a.requests, a.random_input_len, a.random_output_len, a.random_range_ratio,
                                         a.seed),
                f"{a.dataset} {a.random_input_len}/{a.random_output_len} ratio {a.random_range_ratio:g}", seen)
    if a.dataset == "mooncake":
        rows = workloads.mooncake_lengths(Path(a.dataset_path).read_text().splitlines(), a.dataset_path)
        return workloads.sample(rows, a.requests, a.seed), f"mooncake {a.dataset_path}", seen
    if a.dataset == "sharegpt":
        seen = probe(python, model, [a.dataset_path, str(a.requests), str(a.seed)])
        return [tuple(p) for p in seen["pairs"]], f"sharegpt {a.dataset_path}", seen
    return workloads.issue_workload(a.requests, a.seed), "issue", seen


def probe(python: str, model: str, extra: list[str] = ()) -> dict[str, Any]:
    import subprocess

    script = Path(__file__).resolve().parent / "model_probe.py"
    p = subprocess.run([python, str(script), model, *extra], capture_output=True, text=True, cwd="/", timeout=900)
    if p.returncode != 0:
        raise ValueError(f"reading the model {model} (or the dataset) in {python} failed:\n{p.stderr[-1500:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def token_ids(model: str, python: str, vocab: int | None, seen: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """({"ids": [low, high), "exclude": special ids}, context length or 0) of the model."""
    local = Path(model) / "config.json"
    if vocab:
        return {"ids": [0, vocab], "exclude": []}, 0
    if local.is_file():
        conf = json.loads(local.read_text())
        text = conf.get("text_config") or conf
        special: set[int] = set()
        tok = Path(model) / "tokenizer.json"
        if tok.is_file():
            special = {t["id"] for t in json.loads(tok.read_text()).get("added_tokens", []) if t.get("special", True)}
        return {"ids": [0, int(text["vocab_size"])], "exclude": sorted(special)}, \
            int(text.get("max_position_embeddings") or 0)
    seen = seen or probe(python, model)
    return {"ids": [0, seen["vocab"]], "exclude": seen["special"]}, seen["context"]


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    a = ap.parse_args(argv)
    defaults(a)
    try:
        slo = stats.parse_slo(a.slo) if a.slo else None
        if a.from_json:
            from ebctl.ab import output

            return output.from_json(a, slo)
        check(a)
        cfgs, baseline = configs.parse_configs(a.configs, a.baseline)
    except ValueError as e:
        ap.error(str(e))
    from ebctl.ab import output, sitting

    work = a.workdir or Path(tempfile.mkdtemp(prefix="ebab-"))  # short: unix socket paths ≤ 107 bytes
    work.mkdir(parents=True, exist_ok=True)
    try:
        python, launch, env = setup(a, work)
        pairs, source, seen = lengths(a, python, serve_option(launch, "--model-path"))
        ids, ctx = token_ids(serve_option(launch, "--model-path"), python, a.vocab, seen)
        if ctx and (n := workloads.too_long(pairs, ctx)):
            raise ValueError(f"{n} of the {len(pairs)} requests exceed the model's context ({ctx} tokens)")
    except (ValueError, OSError) as e:
        ap.error(str(e))
    launch = [*launch, *shlex.split(a.server_args)]
    from ebctl.ab import device

    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}
    settings.update(baseline=baseline, slo=list(slo) if slo else None)
    command = "ebctl ab " + shlex.join(sys.argv[2:] if argv is None else argv)
    port = int(serve_option(launch, "--port") or 0)
    environment = device.environment(python)
    if environment.get("sglang_found") is False:
        ap.error(f"--python {python}: no sglang there; install ebctl with it (pip install 'ebctl[sglang]') or "
                 "give the Python that has it")
    plan = sitting.Plan(cfgs=cfgs, baseline=baseline, python=python, args=launch, env=env, pairs=pairs, ids=ids,
                        work=work, settings=settings, source=source, command=command,
                        environment=environment, port=port)
    mean_in, mean_out = statistics.fmean(p[0] for p in pairs), statistics.fmean(p[1] for p in pairs)
    loop = f"open loop at {a.rate:g} req/s" if a.loop == "open" else f"closed loop c = {a.concurrency}"
    print(f"[ab] {', '.join(plan.names)}: {a.runs} round(s) of {a.duration:.0f} s, {loop}, {len(pairs)} pairs "
          f"({source}, seed {a.seed}: mean input {mean_in:.1f}, mean output {mean_out:.1f}); fresh random prompts\n"
          f"[ab] launch args: {shlex.join(launch)}; pinned: {'yes' if a.pin else 'no'}; workdir {work}\n"
          f"[ab] {output.where(plan.environment)}", flush=True)
    return output.finish(plan, a, slo, work)


def setup(a: argparse.Namespace, work: Path) -> tuple[str, list[str], dict[str, str]]:
    """(the server's Python, launch arguments, environment added) for the user's server or the CPU demo."""
    if not a.cpu_demo:
        return a.python or sys.executable, list(a.launch), {}
    from ebctl.ab import cpu

    try:
        venv = cpu.venv(a.venv)
    except cpu.NoCheckout as e:
        raise ValueError(str(e)) from None
    python = a.python or str(venv / "bin" / "python")
    model = cpu.tiny_model(Path(python), a.model or work / "model")
    return python, [*cpu.base_args(model), *a.launch], cpu.env()
