"""Who may talk to the daemon (docs/design.md §3, last point).

``ipc://`` endpoints live in a directory only the service user can enter (mode 0700): the directory is
the access control. A ``tcp://`` endpoint needs CURVE keys from ``ebctl keygen`` (the daemon's key pair
and a list of authorised client public keys, checked by a ZAP authenticator); plaintext TCP is refused
unless ``daemon.insecure`` is set explicitly. Everything here runs once at start-up, never per message.
"""

from __future__ import annotations

import ipaddress
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

import zmq
import zmq.auth

if TYPE_CHECKING:
    from zmq.auth.thread import ThreadAuthenticator

    from ebctl.config import Config

ENDPOINTS = ("telemetry", "policy", "control")
_LOCAL_TRANSPORTS = ("ipc", "inproc")
_Z85_KEY_LEN = 40


class SecurityError(Exception):
    """A socket set-up that would let strangers in (or a key that cannot be read); says how to fix it."""


def transport(endpoint: str) -> str:
    """``"tcp"`` for ``tcp://host:port`` (what comes before ``://``; ``""`` if there is none)."""
    head, sep, _ = endpoint.partition("://")
    return head.lower() if sep else ""


def needs_curve(endpoint: str) -> bool:
    """True for every transport that leaves the machine's file-system permissions behind (tcp, ws, ...)."""
    return transport(endpoint) not in _LOCAL_TRANSPORTS


def ipc_path(endpoint: str) -> Path | None:
    """The socket file of an ``ipc://`` endpoint (None for other transports and abstract sockets)."""
    if transport(endpoint) != "ipc":
        return None
    path = endpoint.partition("://")[2]
    return None if path.startswith("@") else Path(path)


def ensure_runtime_dir(path: str | os.PathLike) -> Path:
    """Create ``path`` with mode 0700 (parents as needed), or check that the existing one is private.

    Refuses (SecurityError) a path that is not a directory, is a symbolic link, belongs to another user,
    or lets group or others in: another user could then connect to, or replace, the daemon's sockets.
    """
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        p.parent.mkdir(parents=True, exist_ok=True)
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:  # created by someone else meanwhile: check it like any existing one
            pass
        else:
            os.chmod(p, 0o700)  # the umask may have masked bits off, never on; make it exact anyway
    st = os.lstat(p)
    if stat.S_ISLNK(st.st_mode):
        raise SecurityError(f"runtime directory {p} is a symbolic link; use a real directory with mode 0700")
    if not stat.S_ISDIR(st.st_mode):
        raise SecurityError(f"runtime directory {p} exists and is not a directory")
    if st.st_uid != os.geteuid():
        raise SecurityError(f"runtime directory {p} belongs to uid {st.st_uid}, not to this user "
                            f"(uid {os.geteuid()}); remove it or choose another daemon.runtime_dir")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise SecurityError(f"runtime directory {p} has mode {mode:04o}: group and others may enter it; "
                            f"allowed: 0700 (fix: chmod 700 {p})")
    return p


def is_loopback(host: str) -> bool:
    """``host`` (an address or a name) can only be reached from this machine."""
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_endpoints(cfg: Config) -> None:
    """Refuse a set-up that would let strangers in; say which key to set.

    - a non-ipc endpoint (tcp://...) needs ``daemon.curve_server_key`` and ``daemon.curve_authorized``
      (readable), unless ``daemon.insecure`` is true;
    - an ipc endpoint must be a file path (the abstract namespace ``ipc://@name`` has no permissions),
      unless ``daemon.insecure`` is true. Its directory is checked by ``ensure_runtime_dir`` at bind time.
    """
    d = cfg.daemon
    for which in ENDPOINTS:
        ep = cfg.endpoint(which)
        key = f"daemon.{which}_endpoint"
        if not needs_curve(ep):
            if transport(ep) == "ipc" and ipc_path(ep) is None and not d.insecure:
                raise SecurityError(f"{key}={ep!r}: abstract ipc sockets have no permissions; use a path "
                                    "in daemon.runtime_dir, or set daemon.insecure = true (--insecure)")
            continue
        if d.insecure and not d.curve_server_key:
            continue  # plaintext, asked for explicitly
        missing = [k for k in ("curve_server_key", "curve_authorized") if not getattr(d, k)]
        if missing and not d.insecure:
            raise SecurityError(f"{key}={ep!r} is not an ipc endpoint: it needs CURVE keys "
                                f"({', '.join('daemon.' + m for m in missing)} unset; create them with "
                                "`ebctl keygen`), or plaintext explicitly with daemon.insecure = true (--insecure)")
        server_keypair(d.curve_server_key)  # readable, with a secret half: fail now, not at bind time
        if d.curve_authorized and not Path(d.curve_authorized).exists():
            raise SecurityError(f"daemon.curve_authorized={d.curve_authorized!r}: no such file or directory")


def check_client(endpoint: str, *, curve_client_key: str, curve_server_public: str, insecure: bool) -> bool:
    """Whether a client (link or CLI) must use CURVE on ``endpoint``; SecurityError if it cannot."""
    if not needs_curve(endpoint):
        return False
    if curve_client_key and curve_server_public:
        return True
    if insecure:
        return False
    raise SecurityError(f"{endpoint!r} is not an ipc endpoint: it needs CURVE keys (daemon.curve_client_key and "
                        "daemon.curve_server_key, from `ebctl keygen`), or plaintext explicitly with --insecure")


def keygen(directory: str | os.PathLike, name: str, *, force: bool = False) -> tuple[Path, Path]:
    """Create ``{directory}/{name}.key`` (public, 0644) and ``{name}.key_secret`` (0600).

    The directory is created with mode 0700 if missing. Existing files are kept (SecurityError) unless
    ``force``: overwriting a key silently locks every peer out.
    """
    if not name or "/" in name or name.startswith("."):
        raise SecurityError(f"key name {name!r}: use a plain file name such as 'daemon' or 'engine-1'")
    d = Path(directory).expanduser()
    if not d.exists():
        d.mkdir(parents=True, mode=0o700)
    public, secret = d / f"{name}.key", d / f"{name}.key_secret"
    if not force and (public.exists() or secret.exists()):
        raise SecurityError(f"{public} or {secret} exists; remove it first (or force) to replace the key pair")
    old = os.umask(0o077)  # the secret file is never readable by others, not even for an instant
    try:
        pub, sec = zmq.auth.create_certificates(str(d), name)
    finally:
        os.umask(old)
    os.chmod(sec, 0o600)
    os.chmod(pub, 0o644)
    return Path(pub), Path(sec)


def _read_key_file(path: str) -> tuple[bytes, bytes | None]:
    try:
        return zmq.auth.load_certificate(path)
    except (OSError, ValueError) as e:
        raise SecurityError(f"CURVE key file {path!r}: {e}") from None


def _is_z85_key(s: str) -> bool:
    return len(s) == _Z85_KEY_LEN and not os.path.exists(s)


def server_keypair(path: str) -> tuple[bytes, bytes]:
    """(public, secret) of the daemon from its ``.key_secret`` file."""
    public, secret = _read_key_file(path)
    if not secret:
        raise SecurityError(f"daemon.curve_server_key={path!r} holds no secret key (give the .key_secret file)")
    return public, secret


def client_keypair(key: str) -> tuple[bytes, bytes]:
    """(public, secret) of a client from its ``.key_secret`` file, or from a Z85 secret key itself."""
    if _is_z85_key(key):
        return zmq.curve_public(key.encode()), key.encode()
    public, secret = _read_key_file(key)
    if not secret:
        raise SecurityError(f"client key {key!r} holds no secret key (give the .key_secret file)")
    return public, secret


def server_public_key(key: str) -> bytes:
    """The daemon's public key from a Z85 string, its ``.key`` file, or (next to it) its ``.key_secret``.

    A ``name.key_secret`` path is read as its public twin ``name.key`` when that exists, so a client
    never needs read access to the daemon's secret.
    """
    if _is_z85_key(key):
        return key.encode()
    twin = key.removesuffix("_secret")
    return _read_key_file(twin if twin != key and os.path.exists(twin) else key)[0]


def apply_server(sock: zmq.Socket, server_key: str) -> None:
    """Make ``sock`` a CURVE server with the daemon's key pair (call before bind)."""
    public, secret = server_keypair(server_key)
    sock.curve_publickey, sock.curve_secretkey = public, secret
    sock.curve_server = True


def apply_client(sock: zmq.Socket, client_key: str, server_public: str) -> None:
    """Make ``sock`` a CURVE client of the daemon (call before connect)."""
    sock.curve_publickey, sock.curve_secretkey = client_keypair(client_key)
    sock.curve_serverkey = server_public_key(server_public)


def start_authenticator(ctx: zmq.Context, cfg: Config) -> ThreadAuthenticator | None:
    """The ZAP authenticator admitting the public keys in ``daemon.curve_authorized`` (a directory of
    ``*.key`` files, or one such file); None when no endpoint uses CURVE. Any client key is admitted only
    if curve_authorized is empty and ``daemon.insecure`` is set (encrypted, not authenticated)."""
    from zmq.auth.thread import ThreadAuthenticator

    d = cfg.daemon
    if not d.curve_server_key or not any(needs_curve(cfg.endpoint(w)) for w in ENDPOINTS):
        return None
    auth = ThreadAuthenticator(ctx)
    auth.start()
    where = d.curve_authorized
    if not where:
        auth.configure_curve(domain="*", location=zmq.auth.CURVE_ALLOW_ANY)
    elif Path(where).is_dir():
        auth.configure_curve(domain="*", location=where)
    else:
        auth.certs["*"] = {_read_key_file(where)[0]: True}
    return auth
