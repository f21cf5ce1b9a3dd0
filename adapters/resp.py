"""RESP on a bare socket, for the servers' own administration (readiness, the evicting admin connection, the tier,
the nemesis): one command on a fresh connection, PING, a free loopback port. Every socket operation is bounded."""

from __future__ import annotations

import socket
import time

__all__ = ["HOST", "command", "resp_command", "ping", "free_port", "client_ids", "await_new_clients"]

HOST = "127.0.0.1"


def _command(*args: bytes | str) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a.encode() if isinstance(a, str) else a
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def resp_command(host: str, port: int, password: str | None, *args: str, timeout: float = 2.0) -> bytes:
    """One RESP command on a fresh connection to host:port (AUTH first when `password`): its reply's first bytes
    (at most 4 KB), every socket operation bounded by `timeout`."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.settimeout(timeout)
        if password is not None:
            s.sendall(_command("AUTH", password))
            s.recv(256)
        s.sendall(_command(*args))
        return s.recv(4096)


def ping(port: int, password: str | None = None, timeout: float = 1.0) -> bool:
    """True when the server on `port` answers PING (after AUTH when `password` is given)."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout) as s:
            s.settimeout(timeout)
            if password is not None:
                s.sendall(_command("AUTH", password))
                if not s.recv(64).startswith(b"+OK"):
                    return False
            s.sendall(_command("PING"))
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def client_ids(host: str, port: int, password: str | None, *, timeout: float = 2.0) -> tuple[int, list[int]]:
    """(the id of the asking connection, the ids of every normal client connection but it) on host:port: `CLIENT
    ID` and `CLIENT LIST TYPE normal`, the whole bulk reply read. Ids only grow: a connection made later has a
    larger one."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.settimeout(timeout)
        if password is not None:
            s.sendall(_command("AUTH", password))
            s.recv(256)
        s.sendall(_command("CLIENT", "ID") + _command("CLIENT", "LIST", "TYPE", "normal"))
        data = b""
        while True:
            head, sep, rest = data.partition(b"\r\n")
            if sep and head.startswith(b":"):
                size_line, sep2, body = rest.partition(b"\r\n")
                if sep2 and size_line.startswith(b"$") and len(body) >= int(size_line[1:]):
                    break
                if sep2 and size_line.startswith(b"-"):
                    raise OSError(f"CLIENT LIST answered {size_line[:80]!r}")
            elif sep and not head.startswith(b":"):
                raise OSError(f"CLIENT ID answered {head[:80]!r}")
            chunk = s.recv(65536)
            if not chunk:
                raise OSError("the server closed the connection before its CLIENT LIST reply")
            data += chunk
    own = int(head[1:])
    ids = [int(field[3:]) for line in body.split(b"\n") for field in line.split(b" ")[:1] if field.startswith(b"id=")]
    return own, [i for i in ids if i != own]


def await_new_clients(host: str, port: int, password: str | None, *, after: int, want: int, timeout: float,
                      who: str = "the client") -> None:
    """Wait until host:port holds `want` normal client connections newer than id `after` (a client's connections
    that its worker threads make after its constructor returned); `ConnectionError` naming `who` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        made = sum(1 for i in client_ids(host, port, password, timeout=min(2.0, timeout))[1] if i > after)
        if made >= want:
            return
        if time.monotonic() > deadline:
            raise ConnectionError(f"{who} made {made} of its {want} connections to {host}:{port} within {timeout:g} s")
        time.sleep(0.005)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


command = _command
