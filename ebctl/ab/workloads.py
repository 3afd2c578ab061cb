"""What the A/B's client sends: (input, output) length pairs and, for the open loop, arrival times. Pure
functions of numbers and text; reading files and running sglang's dataset loader are the shell's (``load``).

Sources (``--trace``, ``--dataset``):

- the issue's workload (the default, sized for the tiny CPU model): inputs ``10 + floor(231 u^0.9)`` (10-240
  tokens, mean ≈ 131), outputs geometric with mean 43 capped at 160 (mean ≈ 42);
- a trace CSV or any workload of ``ebctl simulate`` (``ebctl.sim.workloads.load``: rows drawn at random, seeded);
- sglang ``bench_serving``'s datasets: ``random`` / ``random-ids`` (lengths uniform in
  [``len * range_ratio``, ``len``], as sglang draws them), ``sharegpt`` (a local ShareGPT JSON through sglang's
  own loader and the model's tokenizer: ``dataset_lengths.py``), ``mooncake`` (a local Mooncake JSONL trace:
  its ``input_length`` / ``output_length``).

Every prompt is fresh random token ids of the pair's input length, whatever the source: the lengths are the
dataset's, the text is not (each run's server starts with an empty prefix cache; within a run, a repeated prompt
would skip its prefill).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable

DATASETS = ("random", "random-ids", "sharegpt", "mooncake")


def issue_workload(n: int = 480, seed: int = 0) -> list[tuple[int, int]]:
    """The issue's (input, output) pairs: inputs 10 + floor(231 u^0.9) (10-240, mean ≈ 131), outputs geometric
    on {1, 2, ...} with mean 43, capped at 160 (mean ≈ 42)."""
    rng = random.Random(seed)
    p = 1 / 43
    out = []
    for _ in range(n):
        inp = 10 + int(231 * rng.random() ** 0.9)
        geo = 1 + int(math.log(1.0 - rng.random()) / math.log(1.0 - p))
        out.append((inp, min(geo, 160)))
    return out


def random_lengths(n: int, input_len: int, output_len: int, range_ratio: float,
                   seed: int = 0) -> list[tuple[int, int]]:
    """sglang's ``random-ids`` lengths: each input uniform on the integers [max(floor(input_len * range_ratio),
    1), input_len], each output likewise (``sglang.benchmark.datasets.common.compute_random_lens``), seeded."""
    if not (input_len >= 1 and output_len >= 1 and 0 <= range_ratio <= 1):
        raise ValueError(f"--random-input-len {input_len}, --random-output-len {output_len}, --random-range-ratio "
                         f"{range_ratio}: lengths must be >= 1 and the ratio in [0, 1]")
    rng = random.Random(seed)

    def draw(full: int) -> int:
        return rng.randint(max(int(full * range_ratio), 1), full)

    return [(draw(input_len), draw(output_len)) for _ in range(n)]


def mooncake_lengths(lines: Iterable[str], source: str = "trace") -> list[tuple[int, int]]:
    """A Mooncake JSONL trace's (input_length, output_length) per row, in order; ValueError naming the line."""
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            pair = (int(row["input_length"]), int(row["output_length"]))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{source}, line {i}: not a Mooncake row with input_length and output_length "
                             f"({type(e).__name__}: {e})") from None
        if min(pair) < 1:
            raise ValueError(f"{source}, line {i}: {pair}: a request needs at least 1 token each way")
        out.append(pair)
    if not out:
        raise ValueError(f"{source}: no rows")
    return out


def sample(pairs: list[tuple[int, int]], n: int, seed: int = 0) -> list[tuple[int, int]]:
    """``n`` of ``pairs`` drawn at random (seeded), without replacement when there are enough."""
    rng = random.Random(seed)
    return rng.sample(pairs, n) if n <= len(pairs) else [rng.choice(pairs) for _ in range(n)]


def poisson_arrivals(rate: float, duration: float, seed: int = 0) -> list[float]:
    """The open loop's send times in [0, duration): a Poisson process at ``rate`` requests per second (the gaps
    exponential with mean 1 / rate), seeded."""
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"--rate {rate}: must be a positive number of requests per second")
    rng = random.Random(seed)
    out, t = [], rng.expovariate(rate)
    while t < duration:
        out.append(t)
        t += rng.expovariate(rate)
    return out


def too_long(pairs: list[tuple[int, int]], context: int) -> int:
    """How many pairs need more than ``context`` tokens (input + output)."""
    return sum(i + o > context for i, o in pairs)
