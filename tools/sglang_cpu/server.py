"""Start and stop the real sglang server on CPU with the tiny model (test infrastructure, stdlib only).

    from tools.sglang_cpu.server import tiny_server      # or put tools/sglang_cpu on sys.path
    with tiny_server(venv, model_dir, extra_args=["--enable-mixed-chunk"]) as (base_url, proc):
        ...  # POST f"{base_url}/generate"; the server's log is at proc.log_path

    python tools/sglang_cpu/server.py --venv VENV --model DIR [-- EXTRA SGLANG ARGS]   # serve until ^C

The server runs in its own process group with SGLANG_USE_CPU_ENGINE=1 and this directory (the
sgl_kernel stand-in) on PYTHONPATH; stopping it sends SIGTERM to the launcher, then SIGKILL to the group.
Flags and why: docs/sglang-cpu.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

STUB_DIR = Path(__file__).resolve().parent  # holds the sgl_kernel stand-in

BASE_ARGS = (
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--disable-cuda-graph",
    "--max-total-tokens", "16384",
    "--mem-fraction-static", "0.1",
    "--max-running-requests", "16",
    "--sleep-on-idle",  # without it the idle scheduler spins a whole core
)


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out for bind(("", 0)) (Linux: ip_local_port_range; 32768 elsewhere)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    return 32768


def free_port() -> int:
    """A free port below the ephemeral range. A port from bind(0) can be handed out again at once: sglang binds
    its own internal sockets to port 0 while it starts, and in one CI run (--dp-size 2, 2026-11-24) took the
    port a test had just picked for its HTTP server ("address already in use"; the server never served)."""
    rng = random.Random()
    top = min(_ephemeral_low(), 65536)
    for _ in range(200):
        port = rng.randrange(max(10000, top // 2), top)
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind(("127.0.0.1", port))
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


REPO = STUB_DIR.parents[1]


def sglang_venv(arg: str | None = None) -> Path:
    """``arg`` if given, else the cached SGLang CPU environment (``tools/sglang_env.sh`` builds it once)."""
    if arg:
        return Path(arg)
    p = subprocess.run(["bash", str(REPO / "tools" / "sglang_env.sh")], capture_output=True, text=True, check=True)
    return Path(p.stdout.strip().splitlines()[-1])


def ensure_installed(venv: Path) -> None:
    """This checkout, editable and without dependencies, in the SGLang environment (its servers load the
    plugin from there)."""
    code = "import ebctl, sglang_patch; print(ebctl.__file__, sglang_patch.__file__)"
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as the server will import it
    p = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, cwd="/",
                       env=clean)
    if p.returncode != 0 or not all(x.startswith(str(REPO)) for x in p.stdout.split()):
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", "--no-build-isolation", "-e",
                        str(REPO)], check=True)


def server_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for the server: `env` (default os.environ) plus what sglang needs on CPU."""
    out = dict(os.environ if env is None else env)
    out["SGLANG_USE_CPU_ENGINE"] = "1"
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(STUB_DIR), out.get("PYTHONPATH", "")) if p)
    out.setdefault("PYTHONUNBUFFERED", "1")
    return out


def server_command(venv: str | os.PathLike, model_dir: str | os.PathLike, port: int,
                   extra_args: Sequence[str] = ()) -> list[str]:
    """argv for `python -m sglang.launch_server`; later flags in `extra_args` override BASE_ARGS."""
    return [str(Path(venv) / "bin" / "python"), "-m", "sglang.launch_server",
            "--model-path", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
            *BASE_ARGS, *extra_args]


def _get(url: str, timeout: float = 5.0) -> int:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status


def post_json(url: str, payload: dict, timeout: float = 60.0) -> dict:
    """POST JSON, return the decoded answer ({} for an empty body, e.g. /abort_request)."""
    req = urllib.request.Request(url, data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = r.read()
    return json.loads(body) if body.strip() else {}


def wait_ready(base_url: str, proc: subprocess.Popen, timeout: float = 120.0) -> float:
    """Poll /health until it answers 200; return seconds waited. Raise if the server dies or times out."""
    t0 = time.monotonic()
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"sglang server exited with {proc.returncode} before answering; "
                               f"log: {getattr(proc, 'log_path', '?')}\n{_tail(proc)}")
        with contextlib.suppress(OSError, urllib.error.URLError):
            if _get(f"{base_url}/health") == 200:
                return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"sglang server not ready after {timeout:.0f} s; "
                               f"log: {getattr(proc, 'log_path', '?')}\n{_tail(proc)}")
        time.sleep(0.5)


def stop(proc: subprocess.Popen, grace: float = 15.0) -> int | None:
    """Stop the server; return the launcher's exit code.

    SIGTERM to the launcher alone: it drains and takes its scheduler/detokenizer children down itself
    (SIGTERM to the whole group instead makes it see "scheduler crashed" and sleep 5 s in crash
    diagnostics). After `grace` s, or once the launcher is gone, SIGKILL whatever is left in the group.
    """
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the group: scheduler and detokenizer children too
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5.0)
    return proc.returncode


def exit_on_sigterm() -> None:
    """SIGTERM raises SystemExit in the main thread, so that the caller's ``finally`` blocks stop the servers it
    started. A tool left running in the background, where SIGINT is ignored, is stopped with SIGTERM, and
    Python's default action for it ends the process at once and leaves its servers serving."""
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


def _tail(proc: subprocess.Popen, n: int = 40) -> str:
    path = getattr(proc, "log_path", None)
    if not path or not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-n:])


@contextlib.contextmanager
def tiny_server(venv: str | os.PathLike, model_dir: str | os.PathLike, extra_args: Sequence[str] = (),
                env: Mapping[str, str] | None = None, *, port: int | None = None,
                timeout: float = 120.0, log_path: str | os.PathLike | None = None,
                ) -> Iterator[tuple[str, subprocess.Popen]]:
    """Run sglang on CPU; yield (base_url, popen) once /health answers; always stop it on exit.

    `env` replaces os.environ as the base environment (SGLANG_USE_CPU_ENGINE and PYTHONPATH are added).
    The server's stdout+stderr go to `log_path` (default: a temporary file), kept as `popen.log_path`.
    """
    port = port or free_port()
    if log_path is None:
        fd, log_path = tempfile.mkstemp(prefix="sglang-tiny-", suffix=".log")
        os.close(fd)
    log = open(log_path, "wb")  # noqa: SIM115 -- closed in finally
    proc = subprocess.Popen(server_command(venv, model_dir, port, extra_args), env=server_env(env),
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    proc.log_path = str(log_path)  # type: ignore[attr-defined]
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base_url, proc, timeout)
        yield base_url, proc
    finally:
        stop(proc)
        log.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve the tiny model with sglang on CPU until ^C.")
    parser.add_argument("--venv", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="-- then extra sglang flags")
    args = parser.parse_args(argv)
    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    t0 = time.monotonic()
    with tiny_server(args.venv, args.model, extra, port=args.port, timeout=args.timeout) as (url, proc):
        print(f"ready in {time.monotonic() - t0:.1f} s: {url} (pid {proc.pid}, log {proc.log_path})",
              flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
