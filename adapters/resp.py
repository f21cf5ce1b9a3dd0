"""RESP on a bare socket, for the servers' own administration (readiness, the evicting admin connection, the tier,
the nemesis): one command on a fresh connection, PING, a free loopback port. Every socket operation is bounded."""

from __future__ import annotations

import socket

__all__ = ["HOST", "command", "resp_command", "ping", "free_port"]

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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


command = _command
