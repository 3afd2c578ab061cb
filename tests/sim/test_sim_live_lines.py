"""The live simulated engine (``ebctl start --engine sim``): its defaults and what its [sim] lines say."""

from __future__ import annotations

from types import SimpleNamespace

from ebctl.protocol import BatchKind, IterationReport, Mode, Policy
from ebctl.sim import live


def eb(k: int, n: int) -> Policy:
    return Policy(engine_id="e", version=1, mode=Mode.EB, k=k, n_max=n)


def report(t0: float, t1: float, running: int = 300, waiting: int = 1700) -> IterationReport:
    return IterationReport(engine_id="e", seq=1, wall_time=t1, forward_s=t1 - t0, kind=BatchKind.DECODE,
                           running=running, waiting=waiting)


def test_describe():
    assert live.describe(None) == "stock"
    assert live.describe(Policy(engine_id="e", version=1, mode=Mode.OFF)) == "stock"
    assert live.describe(Policy(engine_id="e", version=1, mode=Mode.MB, n_max=9)) == "mb"
    assert live.describe(eb(60, 342)) == "eb k=60 N=342"


def test_bought_compares_whole_runs_of_each_mode():
    runs = (("stock", 1790.0 * 1000, 1000.0), ("eb", 1830.0 * 500, 500.0))
    # 1830 / 1790 − 1 = +2.23%
    assert live.bought(runs, "eb") == "eb +2.2% on stock: 1,830 against 1,790 output tok/s (over 500 s and 1,000 s)"
    assert live.bought(runs, "stock") == ""
    assert live.bought((("stock", 1e6, 1000.0), ("mb", 290.0, 29.0)), "mb") == ""  # under 30 s: not yet
    assert live.bought((("eb", 1e6, 1000.0),), "eb") == ""  # no stock to compare with


def test_line_names_the_change():
    iv = live.Interval(100.0, 150.0, 90_000, ("stock", "eb k=60 N=342"), 320, 1728)
    assert live.line(iv) == ("[sim] t=   150s  output 1,800 tok/s  running 320 waiting 1728  "
                             "policy stock → eb k=60 N=342")
    many = live.Interval(0.0, 10.0, 10, ("stock", "mb", "stock", "eb k=1 N=2", "mb"), 1, 2)
    assert "policy stock → … → mb (4 changes)" in live.line(many)


def test_pacer_counts_each_steps_tokens_to_the_policy_it_ran_under(capsys):
    source = SimpleNamespace(last=None)
    engine = SimpleNamespace(tokens_out=0)
    pacer = live.Pacer(source, speed=1e12, every_s=0.0)  # a line after every step, no sleeping
    pacer.attach(engine)
    engine.tokens_out = 100  # the warm-up interval: the batch fills, not counted to any mode
    pacer(0.0, report(0.0, 10.0))
    engine.tokens_out += 40 * 1000  # stock: 1,000 tok/s over 40 s
    pacer(10.0, report(10.0, 50.0))
    source.last = eb(60, 342)
    engine.tokens_out += 40 * 1100  # eb: 1,100 tok/s over 40 s
    pacer(50.0, report(50.0, 90.0, running=320, waiting=1728))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[sim] t=    10s  output    10 tok/s")
    assert lines[1] == "[sim] t=    50s  output 1,000 tok/s  running 300 waiting 1700  policy stock"
    assert lines[2] == "[sim] t=    90s  output 1,100 tok/s  running 320 waiting 1728  policy stock → eb k=60 N=342"
    # k/N = 60/342 = 0.175: 4·log2(0.175) = −10.04, on the grid 2^(−10/4) = 0.177
    assert lines[3].split(maxsplit=1)[1] == ("eb θ≈0.177 +10.0% on stock: 1,100 against 1,000 output tok/s "
                                            "(over 40 s and 40 s)")


def test_the_demo_saturates_the_engine_by_default(tmp_path, monkeypatch, capsys):
    # twice the slots in flight: requests always wait, which the measured tuner needs to run a trial
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[daemon]\nruntime_dir = "{tmp_path / "rt"}"\n')
    monkeypatch.setattr(live.signal, "signal", lambda *a: None)
    assert live.main(["--config", str(cfg), "--requests", "20", "--workload", "uniform:L=50,O=5",
                      "--speed", "1e9"]) == 0
    out = capsys.readouterr().out
    assert "2048 requests in flight on 1024 slots, speed x1e+09" in out and "[sim] done" in out
    assert live.main(["--config", str(cfg), "--requests", "20", "--workload", "uniform:L=50,O=5",
                      "--max-running", "8", "--speed", "1e9"]) == 0
    assert "16 requests in flight on 8 slots" in capsys.readouterr().out


def test_an_eb_arm_is_its_theta_on_the_tuners_quarter_octave_grid_whatever_its_n():
    # θ = 0.0841 (the tuner's eb@ arm) ran as k = 27 of N = 330 and k = 29 of N = 350: one arm, 2^(−14/4) = 0.0884
    assert live.arm_of(eb(27, 330)) == live.arm_of(eb(29, 350)) == "eb θ≈0.0884"
    assert live.arm_of(eb(20, 330)) == "eb θ≈0.0625"  # 0.0606: 4·log2 = −16.2 → 2^(−4)
    assert live.arm_of(None) == "stock"
