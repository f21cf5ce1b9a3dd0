"""What must be stopped when this process exits: one registry of what shardcheck starts, one `atexit` hook.

Whatever starts something that outlives a call (a server, a rank process, a serving stack) registers it with what
stops it, `register(obj, stop)`, before or as it starts; its own stop ends with `unregister(obj)` (a no-op for what
is not registered). `live(kind)` lists what is registered (of a class, or a tuple of classes), oldest first: what
`adapters.valkey_servers.live_pids()` and `server_on(port)` read, and `adapters.mooncake_servers.live_pids()`.

`reap(kind=None)` stops what is registered, the last registered first (a master before the namespace it runs in),
each `stop()` on a daemon thread of its own waited for at most its `bound` seconds (one that hangs is left behind:
what shardcheck spawns is tied to this process anyway), an exception in one never keeping the others from being
stopped; it answers what went wrong, a line each. A stop that failed leaves its object registered.

- `reap()`, every kind, is the exit: this module's `atexit` hook (which writes what went wrong to stderr), and a fatal
  signal's (`adapters.valkey_servers`: `inline`, each stop on the interrupted thread itself, which may hold a lock the
  stop takes). From its start `REAPER.exiting()` is true and `register` refuses anything new
  (`Exiting`, a RuntimeError): a daemon thread still starting a server would leave it behind. What is registered
  already may register again (a no-op): a server respawned while the exit stops the others is still stopped.
- `reap(kind)` stops that kind only (`adapters.mooncake_servers.shutdown()`), refusing it while it runs.

`unregister` takes no lock, so a stop run from a signal handler that interrupted this module never waits for it.
A second Ctrl-C while the exit stops things does not skip the rest: each is still stopped, and the interrupt raised
after. `own_process(proc)` and `kill_process(proc)` do this for a started `multiprocessing.Process`.
A forked child owns nothing of its parent's: the registry is emptied in it.

Temp dirs are registered the same way: `temp_dir(prefix)` makes one, `remove_dir(path)` removes it, and the exit
removes every one still there, after the stops. None is made once the exit began (`Exiting`), and the exit's list is
taken under the same lock a dir is made under: a daemon thread making one while the process exits (a deployment's
build, cut off by `os._exit`) can never leave it behind.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import sys
import tempfile
import threading
from typing import Any, Callable, TypeVar, Union, overload

import attrs

__all__ = ["Exiting", "Reaper", "REAPER", "STOP_SECONDS", "live", "reap", "register", "unregister",
           "own_process", "kill_process", "stop_child", "run_child", "exit_now", "temp_dir", "remove_dir"]

#: Seconds a registered stop may take at exit before it is left behind.
STOP_SECONDS = 10.0

T = TypeVar("T")
#: What `live` and `reap` select by: a class or a tuple of classes (`isinstance`); None: everything.
Kind = Union[type, tuple[type, ...], None]


class Exiting(RuntimeError):
    """Nothing new is registered: the process is exiting (or what is registered of that kind is being stopped)."""


@attrs.frozen
class _Entry:
    obj: Any
    stop: Callable[[], object]
    bound: float


def _describe(obj: Any) -> str:
    pid = None
    with contextlib.suppress(Exception):
        pid = getattr(obj, "pid", None)
    return type(obj).__name__ + (f" (pid {pid})" if isinstance(pid, int) else "")


def _stop_bounded(entry: _Entry, inline: bool = False) -> str | None:
    """`entry.stop()` on a daemon thread, waited for at most `entry.bound` s (`inline`: on this thread, its own calls
    bounded); what went wrong, or None."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            entry.stop()
        except BaseException as exc:  # (reported: one stop's failure never keeps the others from running)
            raised.append(exc)

    if inline:  # (a KeyboardInterrupt is the caller's: `Reaper.reap` stops the rest, then raises it)
        try:
            entry.stop()
        except Exception as exc:
            return f"stopping {_describe(entry.obj)} raised {exc!r}"
        return None
    thread = threading.Thread(target=run, name="shardcheck-reaper", daemon=True)
    try:
        thread.start()
    except RuntimeError:  # no new thread at this point of the interpreter's shutdown: stopped here, unbounded
        run()
    else:
        thread.join(entry.bound)
        if thread.is_alive():
            return f"stopping {_describe(entry.obj)} did not end within {entry.bound:g} s (left behind)"
    return f"stopping {_describe(entry.obj)} raised {raised[0]!r}" if raised else None


class Reaper:
    """The registry (see the module doc); `REAPER` is this process's, the one the module's functions use."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # (reentrant: a signal handler's `reap` may interrupt a `register`)
        self._entries: dict[int, _Entry] = {}  # by id: the entry holds its object, so the id is not reused
        self._exiting = False
        self._closing: list[type | tuple[type, ...]] = []
        self._dirs: set[str] = set()

    def temp_dir(self, prefix: str) -> str:
        """A new private dir in the temp dir, removed at exit if `remove_dir` did not remove it; `Exiting` once the exit
        began. (Its path is registered before it exists: a KeyboardInterrupt in between leaves nothing.)"""
        with self._lock:
            if self._exiting:
                raise Exiting(f"no temp dir {prefix}* made: the process is exiting")
            while True:
                path = os.path.join(tempfile.gettempdir(), prefix + secrets.token_hex(4))
                self._dirs.add(path)
                try:
                    os.mkdir(path, 0o700)
                    return path
                except FileExistsError:
                    self._dirs.discard(path)

    def remove_dir(self, path: str) -> None:
        """Remove a dir `temp_dir` made (and all in it); nothing to do for it at exit."""
        shutil.rmtree(path, ignore_errors=True)
        self._dirs.discard(path)

    def register(self, obj: Any, stop: Callable[[], object], *, bound: float = STOP_SECONDS) -> None:
        """`stop()` stops `obj` at exit (at most `bound` s); `Exiting` once the exit began (or `obj`'s kind is being
        reaped), unless `obj` is registered already."""
        with self._lock:
            if id(obj) in self._entries:
                return
            if self._exiting or any(isinstance(obj, kind) for kind in self._closing):
                what = "the process is exiting" if self._exiting else "its kind is being stopped"
                raise Exiting(f"{type(obj).__name__} not started: {what}")
            self._entries[id(obj)] = _Entry(obj, stop, bound)

    def unregister(self, obj: Any) -> None:
        """`obj` is stopped: nothing to do for it at exit. (No lock: a dict's pop is atomic, and while `obj` lives its
        id keys its own entry only.)"""
        self._entries.pop(id(obj), None)

    @overload
    def live(self, kind: type[T]) -> list[T]: ...
    @overload
    def live(self, kind: tuple[type, ...] | None = None) -> list[Any]: ...

    def live(self, kind: Kind = None) -> list[Any]:
        """What is registered (of `kind`), oldest first."""
        with self._lock:
            objs = [entry.obj for entry in list(self._entries.values())]  # (a copy: `unregister` takes no lock)
        if kind is None:
            return objs
        return [obj for obj in objs if isinstance(obj, kind)]

    def exiting(self) -> bool:
        """Whether the exit's `reap()` began (nothing new is registered from then on)."""
        return self._exiting

    def reap(self, kind: Kind = None, *, inline: bool = False) -> list[str]:
        """Stop what is registered (of `kind`; None: everything, and the exit begins), the last registered first, each
        bounded (`inline`: each on this thread); what went wrong, a line each. A KeyboardInterrupt during one stop
        is raised once every other was stopped."""
        with self._lock:
            if kind is None:
                self._exiting = True
            else:
                self._closing.append(kind)
            entries = [e for e in list(self._entries.values()) if kind is None or isinstance(e.obj, kind)]
            dirs = sorted(self._dirs) if kind is None else []  # (none is made from here on: `temp_dir`)
        problems: list[str] = []
        interrupted: KeyboardInterrupt | None = None
        try:
            for entry in reversed(entries):
                try:
                    problem = _stop_bounded(entry, inline)
                except KeyboardInterrupt as exc:  # (a second Ctrl-C at exit: the rest are still stopped)
                    interrupted, problem = exc, f"stopping {_describe(entry.obj)} was interrupted"
                if problem is not None:
                    problems.append(problem)
            for path in dirs:  # (after the stops: a server's dir outlives its process)
                self.remove_dir(path)
            if interrupted is not None:
                raise interrupted
            return problems
        finally:
            if kind is not None:
                with self._lock:
                    self._closing.remove(kind)

    def _forget(self) -> None:
        """In a forked child: its parent's entries are not its own (and another thread may have held the lock)."""
        self._lock = threading.RLock()
        self._entries = {}
        self._closing = []
        self._dirs = set()


REAPER = Reaper()


def register(obj: Any, stop: Callable[[], object], *, bound: float = STOP_SECONDS) -> None:
    """`REAPER.register`: `stop()` stops `obj` at exit; `Exiting` once the exit began."""
    REAPER.register(obj, stop, bound=bound)


def unregister(obj: Any) -> None:
    """`REAPER.unregister`: `obj` is stopped."""
    REAPER.unregister(obj)


@overload
def live(kind: type[T]) -> list[T]: ...
@overload
def live(kind: tuple[type, ...] | None = None) -> list[Any]: ...


def live(kind: Kind = None) -> list[Any]:
    """`REAPER.live`: what is registered (of `kind`), oldest first."""
    return REAPER.live(kind)


def reap(kind: Kind = None, *, inline: bool = False) -> list[str]:
    """`REAPER.reap`: stop what is registered (of `kind`; None: the exit), last registered first, each bounded."""
    return REAPER.reap(kind, inline=inline)


def temp_dir(prefix: str) -> str:
    """`REAPER.temp_dir`: a new private temp dir, removed at exit at the latest; `Exiting` once the exit began."""
    return REAPER.temp_dir(prefix)


def remove_dir(path: str) -> None:
    """`REAPER.remove_dir`: remove a dir `temp_dir` made."""
    REAPER.remove_dir(path)


def kill_process(proc: Any, wait: float = 5.0) -> None:
    """Kill a started `multiprocessing.Process` (if it still runs), join it (at most `wait` s), unregister it."""
    if proc.is_alive():
        proc.kill()
    proc.join(wait)
    unregister(proc)


def stop_child(proc: Any, grace: float = 5.0, interrupted: float = 20.0) -> None:
    """Stop a `subprocess.Popen` child that ends what it started on a SIGINT (a `shardcheck` command): `grace` seconds
    to end by itself (a Ctrl-C at the terminal reached its process group too, and a second SIGINT would cut its own
    clean-up short), then a SIGINT and `interrupted` seconds, then killed. Its pipes, if any, are read meanwhile (a
    child blocked writing to a full one would never end)."""
    import signal
    import subprocess

    def wait(seconds: float) -> None:
        if proc.stdout is not None or proc.stderr is not None:
            proc.communicate(timeout=seconds)
        else:
            proc.wait(seconds)
    with contextlib.suppress(subprocess.TimeoutExpired):
        wait(grace)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            wait(interrupted)
        except subprocess.TimeoutExpired:
            proc.kill()
            wait(10)


def run_child(argv: list[str], *, timeout: float, **popen: Any) -> Any:
    """`subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **popen)` for a child that ends what it
    started on a SIGINT: on a timeout or an interrupt (a Ctrl-C reaches its process group too) it is stopped by
    `stop_child`, never killed first, then the `subprocess.TimeoutExpired` or the interrupt is raised."""
    import subprocess
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_child(proc, grace=0.0)
        raise
    except BaseException:
        stop_child(proc)
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def exit_now(code: int) -> None:
    """End this process at once (`os._exit`: a child whose threads, LMCache's or vLLM's, would keep it alive, or whose
    interpreter's finalisation takes seconds), once what it registered is stopped and removed (`reap()`, which
    `os._exit` would skip with the `atexit` hook)."""
    with contextlib.suppress(BaseException):
        reap()
    os._exit(code)


def own_process(proc: Any) -> None:
    """Register a started `multiprocessing.Process` to be killed at exit (`kill_process`); once the exit began, it is
    killed at once and `Exiting` raised."""
    try:
        register(proc, lambda: kill_process(proc))
    except Exiting:
        kill_process(proc)
        raise


def _at_exit() -> None:
    for problem in REAPER.reap():
        print(f"shardcheck: at exit, {problem}", file=sys.stderr)


atexit.register(_at_exit)
os.register_at_fork(after_in_child=lambda: REAPER._forget())
