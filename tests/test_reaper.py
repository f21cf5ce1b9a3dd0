"""`runtime.reaper`: what is registered is listed and stopped at exit, the last registered first, each stop bounded,
one failing stop never keeping the others from running, and nothing new registered once the exit began."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from adapters.process_signals import process_state
from runtime import reaper
from runtime.reaper import Exiting, Reaper

ROOT = Path(__file__).resolve().parents[1]


class Server:
    """Something started: its stop records itself and unregisters it, as a real one's does."""

    def __init__(self, registry: Reaper, name: str, log: list[str], *, fails: bool = False) -> None:
        self.registry, self.name, self.log, self.fails = registry, name, log, fails

    def stop(self) -> None:
        self.log.append(self.name)
        if self.fails:
            raise OSError(f"{self.name} would not stop")
        self.registry.unregister(self)


class Stack(Server):
    """Another kind."""


def test_register_lists_oldest_first_by_kind_and_unregister_removes():
    r, log = Reaper(), []
    a, b, c = Server(r, "a", log), Stack(r, "b", log), Server(r, "c", log)
    for obj in (a, b, c):
        r.register(obj, obj.stop)
    assert r.live() == [a, b, c]
    assert r.live(Stack) == [b] and r.live(Server) == [a, b, c] and r.live((Stack,)) == [b]
    r.register(a, lambda: log.append("another stop"))  # registered already: a no-op, its place and stop kept
    assert r.live() == [a, b, c]
    r.unregister(b)
    r.unregister(b)  # (twice, or never registered: nothing happens)
    r.unregister(object())
    assert r.live() == [a, c] and r.live(Stack) == []
    assert r.reap() == [] and log == ["c", "a"]


def test_reap_stops_everything_last_first_even_when_one_stop_raises():
    r, log = Reaper(), []
    servers = [Server(r, "first", log), Server(r, "broken", log, fails=True), Server(r, "last", log)]
    for s in servers:
        r.register(s, s.stop)
    problems = r.reap()
    assert log == ["last", "broken", "first"]
    assert len(problems) == 1 and "Server" in problems[0] and "raised OSError('broken would not stop')" in problems[0]
    assert r.live() == [servers[1]]  # a stop that failed leaves its object registered


def test_each_stop_is_bounded_and_the_others_still_run():
    r, log, release = Reaper(), [], threading.Event()
    quick = Server(r, "quick", log)
    r.register(quick, quick.stop)
    hung = Server(r, "hung", log)
    r.register(hung, lambda: release.wait(60), bound=0.3)
    last = Server(r, "last", log)
    r.register(last, last.stop)
    t0 = time.monotonic()
    try:
        problems = r.reap()
        took = time.monotonic() - t0
    finally:
        release.set()
    assert took < 5.0, f"reap waited {took:.1f} s for a stop bounded at 0.3 s"
    assert problems == ["stopping Server did not end within 0.3 s (left behind)"]
    assert log == ["last", "quick"]


def test_nothing_new_is_registered_once_the_exit_began():
    r, log = Reaper(), []
    kept = Server(r, "kept", log, fails=True)
    r.register(kept, kept.stop)
    refused: list[BaseException] = []

    def stop_and_start_another() -> None:  # a thread starting something while the exit stops the rest
        with pytest.raises(Exiting, match="Server not started: the process is exiting") as info:
            r.register(Server(r, "late", log), lambda: log.append("late stopped"))
        refused.append(info.value)

    starter = Server(r, "starter", log)
    r.register(starter, stop_and_start_another)
    assert not r.exiting()
    r.reap()
    assert r.exiting() and len(refused) == 1 and isinstance(refused[0], RuntimeError)
    with pytest.raises(Exiting):
        r.register(Server(r, "after", log), lambda: None)
    r.register(kept, kept.stop)  # what is registered already may register again (a respawn while the exit runs)
    assert r.live() == [kept, starter] and "late stopped" not in log


def test_reaping_one_kind_refuses_that_kind_only_and_only_while_it_runs():
    r, log = Reaper(), []
    stack, server = Stack(r, "stack", log), Server(r, "server", log)
    during: list[str] = []

    def stop_stack() -> None:
        try:
            r.register(Stack(r, "new stack", log), lambda: None)
            during.append("stack accepted")
        except Exiting:
            during.append("stack refused")
        other = object()
        r.register(other, lambda: None)
        r.unregister(other)
        during.append("other accepted")
        stack.stop()

    r.register(server, server.stop)
    r.register(stack, stop_stack)
    assert r.reap(Stack) == []
    assert during == ["stack refused", "other accepted"] and log == ["stack"] and r.live() == [server]
    assert not r.exiting()
    again = Stack(r, "again", log)
    r.register(again, again.stop)  # accepted again once that reap returned
    assert r.live() == [server, again]


def test_a_registration_racing_the_exit_is_either_refused_or_stopped():
    """Threads keep registering while `reap()` runs: every object accepted is stopped (none slips in after the
    reap took its list), every other one was refused."""
    r = Reaper()
    accepted: list[object] = []
    stopped: list[object] = []
    lock = threading.Lock()

    def keep_registering() -> None:
        while True:
            obj = object()
            try:
                r.register(obj, lambda obj=obj: (stopped.append(obj), r.unregister(obj)))
            except Exiting:
                return
            with lock:
                accepted.append(obj)

    threads = [threading.Thread(target=keep_registering, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    assert r.reap() == []
    for t in threads:
        t.join(10)
    assert accepted and not any(t.is_alive() for t in threads)
    assert {id(o) for o in stopped} == {id(o) for o in accepted} and r.live() == []


def test_the_module_functions_use_this_process_registry(monkeypatch):
    fresh = Reaper()
    monkeypatch.setattr(reaper, "REAPER", fresh)
    obj, log = object(), []
    reaper.register(obj, lambda: log.append("stopped"), bound=1.0)
    assert reaper.live() == [obj] == fresh.live() and reaper.live(int) == [] and not reaper.REAPER.exiting()
    assert reaper.reap() == [] and log == ["stopped"] and reaper.REAPER.exiting()
    reaper.unregister(obj)
    assert fresh.live() == []


_EXIT_SCRIPT = textwrap.dedent("""
    import os, subprocess, sys, time
    from runtime import reaper

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])

    def stop():
        child.kill()
        child.wait()
        reaper.unregister(child)

    reaper.register(child, stop)
    reaper.register(object(), lambda: time.sleep(60), bound=0.5)  # hangs: left behind after 0.5 s
    reaper.register(ValueError(), lambda: 1 / 0)  # raises: the others are stopped all the same
    pid = os.fork()  # a forked child owns nothing of its parent's: its exit stops nothing
    if pid == 0:
        sys.exit(0 if reaper.live() == [] else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and child.poll() is None, "the forked child's exit touched it"
    print(child.pid, flush=True)
    if sys.argv[1] == "raise":
        raise SystemExit("ended by an exception")
""")


def _running(pid: int) -> bool:
    return process_state(pid) not in (None, "Z")


@pytest.mark.parametrize("how", ["return", "raise"])
def test_a_registered_process_is_gone_once_the_interpreter_exits(how: str):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT, how], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    took = time.monotonic() - t0
    pid = int(done.stdout.split()[0])
    try:
        assert not _running(pid), f"the registered process {pid} outlived the interpreter"
    finally:
        if _running(pid):
            os.kill(pid, 9)
    assert done.returncode == (0 if how == "return" else 1), done.stderr
    assert took < 30, f"the exit took {took:.1f} s (a stop bounded at 0.5 s hung it)"
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("shardcheck: at exit")]
    assert lines == ["shardcheck: at exit, stopping ValueError raised ZeroDivisionError('division by zero')",
                     "shardcheck: at exit, stopping object did not end within 0.5 s (left behind)"], done.stderr


def test_an_interrupted_stop_does_not_skip_the_others():
    """A Ctrl-C during one stop at exit: every other is still stopped, then the interrupt is raised."""
    r, log = Reaper(), []
    first, last = Server(r, "first", log), Server(r, "last", log)
    r.register(first, first.stop)
    middle = object()

    def interrupted() -> None:
        log.append("middle")
        raise KeyboardInterrupt

    r.register(middle, interrupted)
    r.register(last, last.stop)
    with pytest.raises(KeyboardInterrupt):
        r.reap(inline=True)
    assert log == ["last", "middle", "first"] and r.live() == [middle]


def test_an_inline_reap_stops_on_this_thread_what_waits_for_a_lock_it_holds():
    """A fatal signal's reap runs each stop on the interrupted thread: a stop that takes a lock the interrupted code
    holds (a server's, in a respawn's wait) re-enters it instead of waiting for it out of bound."""
    r, log = Reaper(), []
    lock = threading.RLock()

    class Held(Server):
        def stop(self) -> None:
            with lock:
                super().stop()

    held = Held(r, "held", log)
    r.register(held, held.stop, bound=0.2)
    with lock:  # (what the interrupted thread held)
        assert r.reap(inline=True) == []
    assert log == ["held"] and r.live() == []


def test_own_process_kills_it_at_exit_and_refuses_it_once_the_exit_began(monkeypatch):
    import multiprocessing
    r = Reaper()
    monkeypatch.setattr(reaper, "REAPER", r)
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=time.sleep, args=(60,), daemon=True)
    proc.start()
    reaper.own_process(proc)
    assert r.live() == [proc]
    assert r.reap() == [] and not proc.is_alive() and r.live() == []
    late = ctx.Process(target=time.sleep, args=(60,), daemon=True)
    late.start()
    with pytest.raises(Exiting):
        reaper.own_process(late)
    assert not late.is_alive()


def test_stop_child_lets_an_interrupted_child_end_by_itself_then_interrupts_then_kills():
    """`stop_child`: a child ending by itself is left to (one SIGINT reached it already); one still running gets
    a SIGINT; one that ignores SIGINT is killed; a child writing to a full pipe meanwhile is read, never stuck."""
    import subprocess
    import sys
    from runtime.reaper import stop_child
    ends = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    stop_child(ends, grace=30.0)
    assert ends.returncode == 0  # (ended by itself: no SIGINT, -2, was sent)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stop_child(sleeper, grace=0.1)
    assert sleeper.returncode == -2  # (ended by the SIGINT: Python re-raises it)
    code = ("import signal, sys, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
            "sys.stdout.write('x' * 1_000_000); sys.stdout.flush(); time.sleep(60)")
    stubborn = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    stop_child(stubborn, grace=0.1, interrupted=0.5)
    assert stubborn.returncode == -9


def test_run_child_answers_as_subprocess_run_and_stops_a_child_past_its_timeout():
    import subprocess
    import sys
    import pytest
    from runtime.reaper import run_child
    done = run_child([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
                     timeout=30)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
    with pytest.raises(subprocess.TimeoutExpired):
        run_child([sys.executable, "-c", "import time; time.sleep(60)"], timeout=0.5)
