"""A control request refused for its own sake (malformed, an unknown op, a tune the daemon says no to) is the
client's mistake: counted in ``control_refused`` and shown on a dim "refused requests" line of ``ebctl
status``. An op that raises is the daemon's fault: ``faults``, under "problems". Both stay in
``control_errors`` (every ok=false reply), and each has its Prometheus counter."""

import time

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ebctl.cli import view
from ebctl.daemon import Daemon
from ebctl.protocol import ControlRequest, encode


def ask(d: Daemon, op: str, **args):
    return d.handle_control([encode(ControlRequest(op=op, args=args))], time.time())


def lines(d: Daemon) -> list[str]:
    from rich.console import Console

    console = Console(width=200, record=True, color_system=None, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(view.status_view(ask(d, "status").data))
    return console.export_text().splitlines()


def exported(d: Daemon) -> dict[str, float]:
    return {s.name: s.value for f in text_string_to_metric_families(generate_latest(d.registry).decode())
            for s in f.samples if s.name.startswith("ebctl_control_") or s.name == "ebctl_faults_total"}


def test_client_mistakes_are_refused_requests_and_the_daemons_own_errors_are_faults(fast_cfg, monkeypatch):
    d = Daemon(fast_cfg)
    assert not d.handle_control([b"\xff not msgpack"], time.time()).ok
    assert not ask(d, "format-disk").ok
    assert not ask(d, "tune", updates={"controller.theta_min": 0.99, "controller.theta_max": 0.5}).ok
    assert ask(d, "tune", updates={"controller.mode": "mb"}).ok
    c = d.counters
    assert (c.control_refused, c.control_errors, c.faults) == (3, 3, 0)
    shown = lines(d)
    assert "refused requests 3 · malformed 1" in shown
    assert not any(line.startswith("problems") for line in shown), shown

    def broken(args, now):
        raise RuntimeError("a bug")

    monkeypatch.setitem(d._ops, "config", broken)
    reply = ask(d, "config")
    assert not reply.ok and "RuntimeError: a bug" in reply.error
    assert (c.control_refused, c.control_errors, c.faults) == (3, 4, 1)
    assert "problems faults 1" in lines(d)
    assert exported(d) == {"ebctl_control_errors_total": 4.0, "ebctl_control_refused_total": 3.0,
                           "ebctl_faults_total": 1.0}
