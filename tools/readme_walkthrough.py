"""Walk through README.md and docs/ as a newcomer would: a fresh clone, a fresh virtual environment, every command.

    python tools/readme_walkthrough.py [--here] [--all] [--keep]

Every command of the ```bash blocks of README.md and docs/*.md (``docs()``: not docs/results/, the tools' records
and tables, nor the documents of ``NOT_WALKED``) and every ``python tools/...`` / ``bash tools/...`` they
name is either run as written or skipped with its reason (``PLAN``); a command the docs gain without an entry
here fails the walkthrough, and an entry no doc names fails its test, so the two stay in step. Long-running
commands are bounded: ``ebctl start`` runs until the commands of a second shell are done (the CLI table's
commands, in the concrete forms of ``SECOND_SHELL``), then gets Ctrl-C. A command passes when it exits as
expected, prints what it should, and prints no Python traceback. About two minutes; ``--all`` adds the slow
benchmarks.

``--here`` uses this checkout and the ``ebctl`` next to this Python instead of a fresh clone and venv
(quicker; what CI runs is the default). The walkthrough's processes get a private ``XDG_RUNTIME_DIR`` and
``XDG_CONFIG_HOME``, so the demo's default runtime directory and ``ebctl keygen``'s default key directory
are its own and nothing of the user's is touched. Exit code: 0 when every command run passed, else 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SLOW = "a benchmark of {s}; its figures are in docs/results/; --all runs it"
NOT_WALKED: tuple[str, ...] = ()  # documents under docs/ whose commands are history, not instructions (none now)


@dataclass(frozen=True)
class Step:
    """How a documented command is walked: ``run`` (as written, within ``timeout`` s), ``demo`` (the
    supervised demo: bounded, with the second shell's commands meanwhile), ``sglang`` (the real sglang CPU
    server under ``ebctl start``: bounded, ``ebctl status`` must show ``expect``), or ``skip`` (``why``)."""

    how: str
    why: str = ""
    timeout: float = 120.0
    expect: str = ""  # a string its output must contain
    slow: bool = False  # run only with --all


PLAN: dict[str, Step] = {
    "pip install -e . && ebctl start --engine sim": Step("demo", expect="engine sim0"),
    "pip install -e '.[dev]' && python -m pytest": Step("skip", "the whole test suite: .ci/run runs it (minutes)"),
    "ebctl start --engine sim -- --workload balanced --concurrency 64 --speed 100 --requests 1000":
        Step("run", timeout=90, expect="[sim] done"),
    "ebctl simulate --profile qwen3-8b/rtx-pro-6000 --workload azure-conv --concurrency 512 --policies "
    "v0,mb,eb-auto,eb+": Step("run", timeout=180, expect="eb-auto"),
    "ebctl simulate --profile qwen3-8b/rtx-pro-6000 --workload azure-conv --concurrency 256 --policies "
    "'v0,sglang:pd-interval=8,default,default:ttft=10,tpot=0.1' --slo-ttft 10 --slo-tpot 0.1":
        Step("run", timeout=180, expect="sglang:pd-interval=8"),
    "python tools/readme_walkthrough.py": Step("skip", "this walkthrough"),
    "ebctl start --engine sglang --join --server qwen-a -- --model-path Qwen/Qwen3-8B --port 30000 "
    "--enable-mixed-chunk": Step("skip", "needs a GPU and Qwen3-8B; tests/sglang/test_sglang_gateway.py joins two "
                                 "real CPU servers to one node daemon"),
    "smg launch --host 0.0.0.0 --port 8000 --policy least_load --worker-urls http://gpu-node-7:30000 "
    "http://gpu-node-8:30000 --disable-worker-overload-protection --health-check-interval-secs 1 "
    "--health-failure-threshold 2 --health-check-timeout-secs 2": Step(
        "skip", "needs the two GPU nodes it names; tests/sglang/test_sglang_gateway.py runs smg with these settings"),
    "kubectl apply -f deploy/kubernetes/": Step("skip", "needs a Kubernetes cluster; tests/unit/test_deploy.py "
                                                "checks the manifests"),
    "ebctl status --daemon node-a=tcp://10.0.0.1:5557 --daemon node-b=tcp://10.0.0.2:5557": Step(
        "skip", "needs the two nodes it names; tests/daemon/test_fleet.py runs two daemons on TCP with CURVE"),
    "python tools/fleet_real.py --runs 1 --duration 120 --last 60 --kill-at 60": Step(
        "skip", "two real sglang servers behind smg, two fresh fleets of 2 minutes each (about 8 minutes)"),
    "python tools/fleet_real.py --runs 3 --duration 180 --last 90": Step(
        "skip", "two real sglang servers behind smg, six fresh fleets of 3 minutes each (about 30 minutes)"),
    "python tools/sim_fleet.py --write": Step("run", timeout=900, expect="least_load", slow=True,
                                              why=SLOW.format(s="8-32 simulated servers behind smg (8 minutes)")),
    "pip install -e '.[sglang]'": Step("skip", "needs a GPU node: sglang with its CUDA packages, several GB"),
    "bash tools/sglang_cpu/start.sh": Step("sglang", expect="dp0", timeout=900),
    "ebctl status": Step("skip", "run against the CPU server above, and against the demo"),
    "ebctl start --engine sglang -- --model-path Qwen/Qwen3-8B --enable-mixed-chunk --max-running-requests 1024":
        Step("skip", "needs a GPU and downloads Qwen3-8B; tests/sglang runs the real sglang on CPU"),
    "ebctl status --watch": Step("skip", "run against the demo, with the second shell's commands"),
    "python tools/fit_traces.py": Step("run", timeout=120, expect="azure-conv"),
    "python tools/sim_table.py --requests 3000": Step("run", timeout=600, expect="prefill-heavy", slow=True,
                                                      why="about a minute of simulation; --all runs it"),
    "python tools/bench_core.py": Step("run", timeout=120, expect="p50"),
    "python tools/gate_clock.py": Step("run", timeout=600, expect="threshold caused", slow=True,
                                       why="about 30 s of simulation (24 runs); --all runs it"),
    "python tools/gate_clock.py --requests 8000 --concurrency 2048 --seed 0": Step(
        "skip", why="the same command as `python tools/gate_clock.py`, with its defaults spelled out"),
    "python tools/bench_daemon.py": Step("run", timeout=300, slow=True, why=SLOW.format(s="about 40 s")),
    "python tools/bench_link.py": Step("run", timeout=300, slow=True, why=SLOW.format(s="about 35 s")),
    "python tools/bench_sim.py": Step("run", timeout=300, slow=True, why=SLOW.format(s="about 40 s")),
    "python tools/sim_vs_paper.py": Step("run", timeout=900, expect="Table 13", slow=True,
                                         why=SLOW.format(s="about 4 minutes of simulation")),
    "python tools/sim_vs_real.py": Step("skip", "starts the real sglang server twice and measures for about 10 "
                                        "minutes (tools/sglang_env.sh's environment, a quiet machine)"),
    "python tools/sim_vs_real.py --quick": Step("skip", "the real sglang CPU server, 2-3 minutes; "
                                                "tests/sglang/test_sim_vs_real.py runs it"),
    "python tools/bench_hook.py --rounds 3": Step("skip", "starts the real sglang server six times (the "
                                                  "environment of tools/sglang_env.sh; many minutes)"),
    "python tools/bench_hook.py": Step("skip", "starts the real sglang server several times (the environment of "
                                       "tools/sglang_env.sh; many minutes)"),
    "python tools/gen_config_doc.py": Step("run", timeout=60, expect="docs/configuration.md"),
    "bash tools/sglang_env.sh": Step("skip", "builds the 2.7 GB sglang CPU environment; .ci/run does it"),
    "python tools/sim_dp_table.py --seeds 3": Step("run", timeout=1200, expect="highest load meeting the SLO",
                                                   slow=True, why=SLOW.format(s="about 8 minutes")),
    "python tools/sim_dp_table.py --calibrate": Step("run", timeout=120, expect="mean factor"),
    "python tools/bench_sbs.py": Step("run", timeout=120, expect="p50"),
    "python tools/learn_table.py": Step("run", timeout=3600, expect="Below saturation", slow=True,
                                        why=SLOW.format(s="26-35 minutes of simulation (372 runs)")),
    "python tools/learn_table.py --only C --seed 1": Step("run", timeout=600, expect="Shifts", slow=True,
                                                          why=SLOW.format(s="about a minute of simulation")),
    "python tools/learn_table.py --only C --seed 2": Step("run", timeout=600, expect="Shifts", slow=True,
                                                          why=SLOW.format(s="about a minute of simulation")),
    "python tools/learn_real.py --quick": Step("skip", "the real sglang CPU server for about 3 minutes "
                                               "(tools/sglang_env.sh's environment)"),
    "python tools/calibrate_real.py": Step("skip", "the real sglang CPU server twice, about 9 minutes (a quiet "
                                           "machine); tests/sglang/test_sglang_calibrate.py runs --quick"),
    "python tools/learn_real.py": Step("skip", "the real sglang CPU server under load for 5 minutes (a quiet "
                                       "machine)"),
    "python tools/ab_real.py --configs alone,ebctl --runs 3 --duration 480 --last 240": Step(
        "skip", "the real sglang CPU server, six fresh servers of 8 minutes each (a quiet machine, about an hour); "
                "tests/sglang/test_ab_real.py runs a short variant"),
    "python tools/ab_real.py --server-args='--enable-mixed-chunk' --configs alone,mfsd=4,ebctl --runs 2 "
    "--duration 480 --last 240":
        Step("skip", "the real sglang CPU server, six fresh servers of 8 minutes each (about an hour)"),
    "pip install -e '.[sglang,plot]'": Step("skip", "needs a GPU node: sglang with its CUDA packages, several GB"),
    "ebctl ab --configs alone,ebctl --runs 3 --duration 600 --last 300 --pool ab.jsonl -- --model-path "
    "Qwen/Qwen3-8B --tp-size 1": Step("skip", "needs a GPU and Qwen3-8B, six fresh servers of 10 minutes each; "
                                      "tests/unit/test_ab_standin.py runs the GPU path against a stand-in"),
    "ebctl ab --cpu-demo --configs alone,ebctl --runs 2 --duration 120 --last 60": Step(
        "skip", "the real sglang CPU server, four fresh servers of 2 minutes each (about 10 minutes); "
                "tests/sglang/test_ab_cpu.py runs a short variant"),
    "ebctl ab --cpu-demo --configs alone,ebctl --runs 2 --duration 120 --last 60 --rate 20": Step(
        "skip", "the real sglang CPU server, four fresh servers of 2 minutes each (about 10 minutes)"),
    "python tools/ab_pool.py --summary docs/results/ab_real.jsonl --report docs/results/ab_real.md": Step(
        "run", timeout=120, expect="The A/B on the real server"),
    "sudo /opt/ebctl/bin/pip install --upgrade 'ebctl[sglang]'": Step(
        "skip", "upgrades an installed service (root, /opt/ebctl): docs/upgrade.md's procedure on a node"),
    "sudo systemctl restart ebctl": Step("skip", "restarts the installed systemd service on a node"),
    "python tools/sim_cold.py": Step("run", timeout=1800, expect="worst default / best static", slow=True,
                                     why=SLOW.format(s="about 6 minutes of simulation")),
    "python tools/ab_real.py --server-args='--enable-mixed-chunk' --configs "
    "'alone,mfsd=4,pdi=8,ebctl:controller.slo_ttft_s=1;controller.slo_tpot_s=0.015' --runs 2 --duration 480 "
    "--last 240 --slo 1,0.015":
        Step("skip", "the real sglang CPU server, eight fresh servers of 8 minutes each (about 70 minutes)"),
    "python tools/sim_knobs.py": Step("run", timeout=1200, expect="Lowest default / best static", slow=True,
                                      why=SLOW.format(s="about 7 minutes of simulation (648 runs)")),
}

# The CLI table's commands in concrete forms, run against the demo while it runs: (command, must contain[,
# exit code]). The demo's daemon has no config file (none was given), so reload has nothing to re-read.
SECOND_SHELL: list[tuple] = [
    ("ebctl --version", "ebctl "),
    ("ebctl status", "engine sim0"),
    ("ebctl status --all", "published_version"),
    ("ebctl status --json", '"engines"'),
    ("ebctl status --engine sim0", "θ̂*"),
    ("ebctl status --explain", "what the rows and symbols mean"),
    ("ebctl tune set controller.mode=eb+", "controller.mode"),
    ("ebctl config show --daemon", 'mode = "eb+"'),
    ("ebctl config show", "[controller]"),
    ("ebctl reload", "nothing to reload", 2),
    # the demo's saturated engine batches hundreds of decodes at once, so the decode intercept may stay
    # unidentified: calibrate then refuses, saying so (exit 1), instead of writing a profile
    ("ebctl tune calibrate --out {tmp}/calibrated.json", "", (0, 1)),
    ("ebctl config check systemd/ebctl.toml.example", "ok"),
    ("ebctl profiles", "qwen3-8b/h200"),
    ("ebctl keygen --dir {tmp}/keys --name walkthrough", "public key"),
]
# what sglang logs once its warm-up request is done (srt/entrypoints/http_server.py, _wait_and_warmup)
READY = "The server is fired up and ready to roll!"
# `ebctl daemon` with a config file of its own, and `ebctl reload` picking up an edit of that file.
OWN_DAEMON = "ebctl daemon --config {tmp}/ebctl.toml --runtime-dir {tmp}/rt"


def docs(repo: Path = REPO) -> list[Path]:
    """The documents walked: README.md, then docs/*.md (not docs/results/, not ``NOT_WALKED``)."""
    walked = [p for p in sorted((repo / "docs").glob("*.md")) if p.relative_to(repo).as_posix() not in NOT_WALKED]
    return [repo / "README.md", *walked]


def doc_commands(repo: Path = REPO) -> dict[str, str]:
    """Every command of the walked documents, in order, each once: command -> the first document naming it."""
    out: dict[str, str] = {}
    for path in docs(repo):
        for cmd in readme_commands(path.read_text()):
            out.setdefault(cmd, path.relative_to(repo).as_posix())
    return out


def readme_commands(text: str) -> list[str]:
    """The commands a reader would type: lines of ```bash/```sh blocks (comments cut), and inline
    ``python tools/...`` / ``bash tools/...`` spans, in order, each once."""
    out: list[str] = []
    for block in re.findall(r"```(?:bash|sh)\n(.*?)```", text, re.S):
        for line in block.splitlines():
            cmd = re.sub(r"\s+#.*$", "", line).strip()
            if cmd and not cmd.startswith("#"):
                out.append(cmd)
    out += re.findall(r"`((?:python|bash) tools/[^`]*)`", text)
    return list(dict.fromkeys(re.sub(r"\s+", " ", c) for c in out))


class Walk:
    def __init__(self, work: Path, checkout: Path, bindir: Path) -> None:
        self.work, self.checkout, self.bindir = work, checkout, bindir
        self.results: list[tuple[str, str, str]] = []  # (status, command, note)
        self._since = time.monotonic()
        xdg = work / "xdg"
        xdg.mkdir(mode=0o700)
        self.env = {k: v for k, v in os.environ.items() if k not in ("EBCTL_CONFIG", "VIRTUAL_ENV")}
        self.env.update(PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}", XDG_RUNTIME_DIR=str(xdg),
                        XDG_CONFIG_HOME=str(work / "config"), PYTHONUNBUFFERED="1")

    def record(self, status: str, cmd: str, note: str = "") -> bool:
        self.results.append((status, cmd, note))
        took = time.monotonic() - self._since  # since the last record: what CI's time goes to
        self._since = time.monotonic()
        print(f"[{status:>4}] {cmd}" + (f"  ({note})" if note else "") + (f"  [{took:.0f} s]" if took >= 1 else ""),
              flush=True)
        return status == "ok"

    def check(self, cmd: str, rc: int, out: str, expect: str, want_rc: int | tuple[int, ...] = 0) -> bool:
        if rc not in (want_rc if isinstance(want_rc, tuple) else (want_rc,)):
            return self.record("FAIL", cmd, f"exit {rc}, expected {want_rc}: {out[-800:]}")
        if "Traceback (most recent call last)" in out:
            return self.record("FAIL", cmd, f"printed a traceback: {out[-1500:]}")
        if expect and expect not in out:
            return self.record("FAIL", cmd, f"output lacks {expect!r}: {out[-800:]}")
        return self.record("ok", cmd)

    def run(self, cmd: str, *, timeout: float = 120.0, expect: str = "", rc: int | tuple[int, ...] = 0) -> bool:
        try:
            p = subprocess.run(cmd, shell=True, cwd=self.checkout, env=self.env, capture_output=True, text=True,
                               timeout=timeout, executable="/bin/bash")
        except subprocess.TimeoutExpired:
            return self.record("FAIL", cmd, f"still running after {timeout:g} s")
        return self.check(cmd, p.returncode, p.stdout + p.stderr, expect, rc)

    def start(self, cmd: str) -> tuple[subprocess.Popen, Path]:
        """A long-running command in its own process group (Ctrl-C reaches all of it); output to a file."""
        log = self.work / f"bounded.{len(list(self.work.glob('bounded.*')))}.log"
        with open(log, "w") as f:
            proc = subprocess.Popen(cmd, shell=True, cwd=self.checkout, env=self.env, stdout=f,
                                    stderr=subprocess.STDOUT, executable="/bin/bash", start_new_session=True,
                                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        return proc, log

    def stop(self, proc: subprocess.Popen, log: Path, cmd: str, expect: str) -> bool:
        """Ctrl-C (SIGINT to its process group); it must exit 0, and ``expect`` be in its output."""
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        try:
            rc = proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
            return self.record("FAIL", cmd, "did not stop within 30 s of Ctrl-C")
        return self.check(cmd + "  (bounded: Ctrl-C)", rc, log.read_text(errors="replace"), expect)

    def demo(self, cmd: str, step: Step) -> None:
        """``INSTALL && ebctl start ...``: install, start, run the second shell's commands, Ctrl-C."""
        install, _, start = cmd.partition(" && ")
        if install == "true":  # --here: installed already
            self.record("skip", "pip install -e .", "--here: this checkout is installed already")
        elif not self.run(install, timeout=600):
            return
        proc, log = self.start(start)
        try:
            if not self.wait_for_engine(proc):
                self.record("FAIL", start, f"no engine in `ebctl status` after 60 s: {log.read_text()[-800:]}")
                return
            for second, expect, *rc in SECOND_SHELL:
                second = second.format(tmp=self.work)
                if "calibrate" in second:  # the daemon needs good cost fits first: give it up to 30 s
                    deadline = time.monotonic() + 30
                    while time.monotonic() < deadline and subprocess.run(
                            second, shell=True, cwd=self.checkout, env=self.env, capture_output=True).returncode:
                        time.sleep(2)
                self.run(second, timeout=30, expect=expect, rc=rc[0] if rc else 0)
            watch, watch_log = self.start("ebctl status --watch")
            time.sleep(3)
            self.stop(watch, watch_log, "ebctl status --watch", "engine sim0")
        finally:
            self.stop(proc, log, start, step.expect)

    def sglang(self, cmd: str, step: Step) -> None:
        """The CPU recipe: start it (the first run builds sglang's environment), wait for its engine in
        ``ebctl status``, then Ctrl-C: it must stop cleanly."""
        proc, log = self.start(cmd)
        try:
            if not self.wait_for_engine(proc, step.timeout):
                self.record("FAIL", cmd, f"no engine in `ebctl status` after {step.timeout:g} s: "
                            f"{log.read_text(errors='replace')[-1500:]}")
                return
            self.run("ebctl status", timeout=30, expect=step.expect)
            # the engine reports before sglang's own warm-up request is done; a Ctrl-C in between makes that
            # request print a traceback (http_server.py _execute_server_warmup): stop once the server is ready
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and READY not in log.read_text(errors="replace"):
                time.sleep(1)
        finally:
            self.stop(proc, log, cmd, READY)

    def own_daemon(self) -> None:
        """The daemon alone, on a config file; edit the file, ``ebctl reload``, see the change."""
        conf = self.work / "ebctl.toml"
        conf.write_text('[controller]\nmode = "eb"\n')
        cmd = OWN_DAEMON.format(tmp=self.work)
        where = f"--config {conf} --runtime-dir {self.work}/rt"
        proc, log = self.start(cmd)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and subprocess.run(
                    f"ebctl status {where}", shell=True, env=self.env, capture_output=True).returncode:
                time.sleep(0.5)
            conf.write_text('[controller]\nmode = "mb"\n')
            self.run(f"ebctl reload {where}", timeout=30, expect='controller.mode = "mb" (was "eb")')
            self.run(f"ebctl config show --daemon {where}", timeout=30, expect='mode = "mb"')
        finally:
            self.stop(proc, log, cmd, "")

    def wait_for_engine(self, proc: subprocess.Popen, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            p = subprocess.run("ebctl status --json", shell=True, env=self.env, capture_output=True, text=True)
            if p.returncode == 0 and json.loads(p.stdout).get("engines"):
                return True
            time.sleep(1)
        return False


def fresh(work: Path) -> tuple[Path, Path]:
    """A clone of this repository's HEAD and a new virtual environment (pip from it on PATH)."""
    checkout = work / "ebctl"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(checkout)], check=True)
    subprocess.run([sys.executable, "-m", "venv", str(work / "venv")], check=True)
    return checkout, work / "venv" / "bin"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--here", action="store_true", help="this checkout and this Python's ebctl, no fresh clone")
    ap.add_argument("--all", action="store_true", help="also the slow benchmarks and tables")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs of bounded commands)")
    a = ap.parse_args(argv)
    commands = doc_commands()
    unplanned = [c for c in commands if c not in PLAN]
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="ebctl-walk-", dir="/tmp"))  # short: ipc socket paths
    checkout, bindir = (REPO, Path(sys.executable).parent) if a.here else fresh(work)
    walk = Walk(work, checkout, bindir)
    try:
        for cmd in unplanned:
            walk.record("FAIL", cmd, f"in {commands[cmd]} but not in tools/readme_walkthrough.py's PLAN")
        for cmd in commands:
            step = PLAN.get(cmd)
            if step is None:
                continue
            if step.how == "skip" or (step.slow and not a.all):
                walk.record("skip", cmd, step.why)
            elif step.how == "sglang":
                walk.sglang(cmd, step)
            elif step.how == "demo":
                if a.here:
                    cmd = "true && " + cmd.partition(" && ")[2]  # already installed here
                walk.demo(cmd, step)
                walk.own_daemon()
            else:
                walk.run(cmd, timeout=step.timeout, expect=step.expect)
    finally:
        if a.keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    failed = [r for r in walk.results if r[0] == "FAIL"]
    counts = {s: sum(r[0] == s for r in walk.results) for s in ("ok", "skip", "FAIL")}
    print(f"\nreadme walkthrough: {counts['ok']} ok, {counts['skip']} skipped, {counts['FAIL']} failed "
          f"in {time.monotonic() - t0:.0f} s ({'this checkout' if a.here else 'fresh clone of HEAD, fresh venv'})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
