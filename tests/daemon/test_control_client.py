"""ControlClient under interruption: a Ctrl-C at any point of a request must not leave close() waiting."""

import threading

from ebctl.link import ControlClient


def test_close_returns_after_an_interrupt_between_socket_creation_and_storing_it(tmp_path):
    """A KeyboardInterrupt after ``ctx.socket()`` returned and before ``_socket()`` stored the socket in
    ``self._sock`` (while it sets options or connects): the socket is a local of a frame that the traceback
    ``__exit__`` receives keeps alive, and ``ctx.term()`` waits for every open socket of its context, so
    ``with ControlClient(...)`` never returned. The stand-in holds the new socket in a local the same way."""
    client = ControlClient(f"ipc://{tmp_path}/control.sock", timeout_s=0.1)
    real_socket = client._ctx.socket

    def socket_then_ctrl_c(*args, **kw):
        sock = real_socket(*args, **kw)  # noqa: F841 (kept alive by the traceback, as in _socket())
        raise KeyboardInterrupt

    client._ctx.socket = socket_then_ctrl_c
    outcome: list[str] = []

    def run() -> None:
        try:
            with client:
                client.request("status")
        except KeyboardInterrupt:
            outcome.append("interrupted, closed")

    t = threading.Thread(target=run, daemon=True)  # daemon: a hang must not keep pytest from exiting
    t.start()
    t.join(10)
    assert not t.is_alive(), "ControlClient.close() hangs on a socket orphaned by the interrupt"
    assert outcome == ["interrupted, closed"] and client._ctx.closed
