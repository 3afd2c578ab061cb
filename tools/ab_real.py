"""``ebctl ab --cpu-demo`` under its old name: the user's A/B on the real sglang CPU server with the tiny model.

    python tools/ab_real.py [OPTIONS]        # = ebctl ab --cpu-demo [OPTIONS]; docs/ab.md

Every option is ``ebctl ab``'s (``--configs``, ``--runs``, ``--duration``, ``--last``, ``--trace``, ``--slo``,
``--server-args``, ``--quick``, ``--from-json``, ``--no-pin``, ...); the figures, the record and the bootstrap are
the same. The names below are what other tools of this checkout take from it (the harness, the CPU server's base
arguments, the closed-loop client, the figures)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ebctl.ab import cpu  # noqa: E402
from ebctl.ab.configs import parse_config, round_order  # noqa: E402, F401
from ebctl.ab.procs import pin, scheduler_threads, thread_use, tree, tree_cpu  # noqa: E402, F401
from ebctl.ab.report import decode_pace, fmt, pace_table, run_line, table  # noqa: E402, F401
from ebctl.ab.stats import (  # noqa: E402, F401
    BIN_S,
    HIST_S,
    bootstrap_ratio,
    goodput,
    percentile,
    summarize,
)
from ebctl.ab.workloads import issue_workload  # noqa: E402, F401

ISSUE_ARGS = cpu.ISSUE_ARGS
CLIENT = REPO / "ebctl" / "ab" / "client.py"


def harness() -> Any:
    """tests/sglang/harness.py (imports zmq and ebctl; also puts tools/sglang_cpu on sys.path)."""
    sys.path.insert(0, str(REPO / "tests" / "sglang"))
    import harness as h

    return h


def base_args(extra: str) -> list[str]:
    """The CPU server's flags (tools/sglang_cpu/server.py ``BASE_ARGS``), ``--chunked-prefill-size 256``, then
    ``extra`` (split like a shell line)."""
    from server import BASE_ARGS  # tools/sglang_cpu, on the path via harness()

    return [*BASE_ARGS, *ISSUE_ARGS, *shlex.split(extra)]


def model_vocab(model: Path) -> list[int]:
    """The token ids a prompt may use: the model's vocabulary less the tokenizer's special (added) ids."""
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    special: set[int] = set()
    tok = model / "tokenizer.json"
    if tok.is_file():
        special = {t["id"] for t in json.loads(tok.read_text()).get("added_tokens", []) if t.get("special", True)}
    return [i for i in range(vocab) if i not in special]


def start_client(venv: Path, url: str, work: Path, *, concurrency: int, duration: float, drain: float,
                 pairs: list[tuple[int, int]], ids: list[int], seed: int) -> subprocess.Popen:
    """``ebctl ab``'s closed-loop client against ``url`` in a process of its own (the sglang venv's python); its
    spec, log and results (``client.json``) in ``work``."""
    spec = {"url": url, "loop": "closed", "concurrency": concurrency, "duration": duration, "drain": drain,
            "pairs": pairs, "token_ids": ids, "seed": seed, "out": str(work / "client.json"), "arrivals": []}
    (work / "client.spec.json").write_text(json.dumps(spec))
    with open(work / "client.log", "wb") as log:
        return subprocess.Popen([str(venv / "bin" / "python"), str(CLIENT), str(work / "client.spec.json")],
                                cwd="/", stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)


def main(argv: list[str] | None = None) -> int:
    from ebctl.ab.cli import main as ab

    return ab(["--cpu-demo", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
