"""The way back from a follower rank to its group's source rank: "I faulted", so the source can take the whole
group to stock at one iteration.

``group.py``'s envelope runs one way only, source → followers, on sglang's request broadcast. A follower whose
hook raises must not go stock alone (its batches would differ from the others' and TP collectives could hang),
so it tells the source: a ZeroMQ PUSH to a PULL socket the source binds at start, at
``ipc://<daemon.runtime_dir>/group-<launcher pid>-<engine id>.sock``. Every rank of a group is a child of the
same process (sglang's launcher, or its DP controller) and carries the same engine id, so the path is known to
all of them and differs between servers and DP replicas. The follower opens its end only when it faults (a
connect queues the message until the source's end is there: ZMQ_IMMEDIATE is off). On the source a thread of
its own blocks in ``recv`` and appends each notice to :attr:`Inbox.notices`; the scheduler thread looks at
that deque each time it builds an envelope, a truthiness test, no zmq call on sglang's thread.

What happens, and the window that is left (``state.PluginState.fail``, ``envelope``, ``receive``):

1. The follower's hook raises at iteration N. It logs, sends its notice, and keeps applying the group's
   policy: its gate and cap go on deciding as the source's do, so a fault outside a planning decision (the
   report, the forward's timing, the step's bookkeeping) changes no batch.
2. The source reads the notice while it builds the envelope of a later broadcast: N + 1 if the notice is
   there by then, else N + 2 (the ranks synchronise at each broadcast and forward, not in between). It
   switches off and that broadcast carries its farewell, "stock" at generation G + 1; every rank applies it
   before planning that iteration, and the faulted follower switches off for good there too. The whole group
   is stock from one iteration on, and every rank's trace ends on the same ``it`` and ``gen``.
3. The residual window: a fault *inside* a planning decision (the gate, ``_should_defer_prefill``; the cap,
   ``get_num_allocatable_reqs``) leaves that call without the group's answer, and the follower answers stock
   for it. For that one call its batch can differ from the other ranks' (a TP collective could then hang); its
   next decisions are the group's again. A planning fault that recurs on every call keeps the window open
   until the farewell, one or two iterations; so does a fault while the follower applies an envelope (it plans
   under its previous settings). The source's own planning fault has the mirror window: it goes stock at
   once, its followers at the next broadcast.

The socket is a unix socket: it reaches the followers on the source's machine that share its parent process.
A follower on another node (a multi-node TP or PP group), or under Ray actors, cannot reach it: its notice stays
queued, its fault is not carried, and it keeps applying the group's policy (its planning faults answer stock).
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import re
import threading
from typing import NamedTuple

import zmq

_IPC_MAX = 100  # unix socket paths hold ~107 bytes: a longer name is hashed
_SEND_LINGER_MS = 1000  # a follower's notice may wait this long for the source's end at close


class Notice(NamedTuple):
    """A follower's fault: its rank (``reading.Ranks.rank``), what raised, the generation it had applied."""

    rank: int
    where: str
    gen: int


def endpoint(runtime_dir: str, engine_id: str, launcher: int) -> str:
    """The group's channel: one per engine id and launching process, in the runtime directory."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", engine_id)
    path = os.path.join(runtime_dir, f"group-{launcher}-{name}.sock")
    if len(path) > _IPC_MAX:
        path = os.path.join(runtime_dir, f"group-{launcher}-{hashlib.sha1(engine_id.encode()).hexdigest()[:16]}.sock")
    return f"ipc://{path}"


class Inbox:
    """The source's end: bound at start, read by its own thread into ``notices``."""

    def __init__(self, address: str) -> None:
        self.notices: collections.deque[Notice] = collections.deque(maxlen=64)
        path = address.removeprefix("ipc://")
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        self._ctx = zmq.Context(1)
        sock = self._ctx.socket(zmq.PULL)
        sock.linger = 0
        try:
            sock.bind(address)
        except BaseException:
            sock.close(0)
            self._ctx.term()
            raise
        self._closed = False
        self._thread = threading.Thread(target=self._run, args=(sock,), name="ebctl-group-faults", daemon=True)
        self._thread.start()

    def _run(self, sock: zmq.Socket) -> None:
        try:
            while True:
                self.notices.append(_decode(sock.recv()))
        except zmq.ContextTerminated:
            pass
        finally:
            sock.close(0)

    def close(self) -> None:
        """Stop the reader and unbind; never waits (the context ends on a thread of its own: its recv returns)."""
        if not self._closed:
            self._closed = True
            threading.Thread(target=self._ctx.term, name="ebctl-group-faults-close", daemon=True).start()


class Outbox:
    """A follower's end, opened when it faults: the notice is queued at once (never blocks) and leaves on
    zmq's I/O thread. Raises ZMQError where it cannot be queued."""

    def __init__(self, address: str, notice: Notice) -> None:
        self._ctx = zmq.Context(1)
        try:
            sock = self._ctx.socket(zmq.PUSH)
            sock.linger = _SEND_LINGER_MS
            sock.connect(address)
            sock.send(json.dumps(notice._asdict()).encode(), zmq.NOBLOCK)
        except BaseException:
            self._ctx.destroy(linger=0)
            raise

    def close(self) -> None:
        """Once the group went stock (the notice arrived); never waits."""
        if not self._ctx.closed:
            self._ctx.destroy(linger=0)


def _decode(frame: bytes) -> Notice:
    """A notice as the follower sent it; one that does not read is still a fault (rank -1)."""
    try:
        d = json.loads(frame)
        return Notice(int(d["rank"]), str(d["where"]), int(d["gen"]))
    except (ValueError, KeyError, TypeError):
        return Notice(-1, "an unreadable notice", -1)
