"""`--engine sglang-hicache`: SGLang 0.5.23's HiCache storage prefetch as a `model.contract.ServingStack`.

`HiCacheStack` starts one rank process per rank (`sgl_rank`: SGLang's own `HybridCacheController` over a real gloo
group on 127.0.0.1, each rank with its own storage: the `file` backend, `HiCacheFile`, in a directory of its own under
one temporary directory), and is their scheduler, as SGLang's per-rank schedulers are, in lockstep:

- `submit` queues a request; `step` admits every waiting one (each rank starts SGLang's prefetch of the prompt's
  page-aligned prefix before its last token: the hit query, `batch_exists`, then the MIN all-reduce of the hit), runs
  one lockstep drain of every rank's control queues (the MIN over ranks of each queue's size, as
  `drain_storage_control_queues` all-reduces them; a drained hit allocates host pages and starts the page transfer,
  whose acks are MIN-reduced), terminates the prefetch of every request whose deadline passed (SGLang's `timeout`
  prefetch policy, `--hicache-storage-prefetch-policy`'s default: `lookup_timeout` seconds from admission, agreed
  across ranks as SGLang agrees it, by MAX; `prefetch_policy=wait_complete`, SGLang's other waiting policy, never
  terminates one: `UnifiedRadixCache._can_terminate_prefetch`, unified_radix_cache.py:2295), and ends every request whose prefetch ended on every rank: each rank digests the KV its host pool holds for
  the pages the scheduler took, frees them, and writes every full page of the prompt back to its storage
  (`write_storage`, SGLang's write-through backup after prefill) unless the request is a reference.
- The `StackResult`: `reported` is the agreed storage hit in tokens the scheduler used (0 when the hit query had not
  answered by the deadline: the request recomputes); `external` the tokens whose pages were loaded (the agreed
  completed tokens of the last ack); `output` one number per page of the prefetched span, the page's KV on every rank
  (as loaded, or computed: `sgl_kv`), and one for the rest; a reference request computes every page. `top2` has a wide
  gap: there is no model, so no tie.
- `chunk_keys` asks a rank for SGLang's own storage keys; `holdings` reads the rank's storage directory (`local`: this
  stack keeps no pages in host memory between requests, so never held); `evict(remote)` deletes the key's file;
  `fault` pauses (the rank's storage calls block until resumed), kills (they fail, and the directory is emptied) or
  restarts (emptied, answering again) the rank's storage; `leaks` counts the host pages not free and the prefetches
  still holding them; `reset` empties every directory and forgets every request (a rank whose SGLang storage threads
  died, or that died, is started again with all the others); `close` ends every rank process (bounded; killed).

Every call to a rank is bounded (`call_timeout`); a rank that dies or does not answer is an error naming it, with the
tail of its log. SGLang's own gloo sync groups get `sync_timeout` seconds (torch's default, which SGLang keeps, is
1800 s): a rank stuck in them past it fails there, as it would in production after half an hour.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import socket
import sys
import threading
import time
from multiprocessing.connection import Listener
from pathlib import Path
from typing import Any, Sequence

import attrs

from adapters.sglang_hicache.sgl_kv import combine, expected, tail_token
from adapters.spawning import SPAWNER, kill_spawned
from model.contract import StackRequest, StackResult
from model.faults import check_held, held_kind
from runtime import reaper

__all__ = ["HiCacheStack", "RankError", "factory", "CONNECTORS", "OPTIONS"]

#: The storage backends this stack runs here.
CONNECTORS = ("file",)
#: The factory options (`--engine-option`); shardcheck gives `patches` itself.
OPTIONS = ("tp", "page_size", "lookup_timeout", "sync_timeout", "call_timeout", "start_timeout", "host_tokens",
           "prefetch_policy", "patches")
#: SGLang's prefetch stop policies this scheduler applies (`best_effort`, which takes whatever has landed at the first
#: scheduling pass, is not one: its hits depend on the pass's timing alone).
POLICIES = ("timeout", "wait_complete")
ROOT = Path(__file__).resolve().parents[2]


class RankError(RuntimeError):
    """A rank process died, raised in a call, or did not answer within its bound."""


class _Link:
    """The parent's end of one rank process: its process, its connection, its log."""

    def __init__(self, rank: int, proc: Any, log: Path) -> None:
        self.rank, self.proc, self.log = rank, proc, log
        self.conn: Any = None
        self.ids = 0
        self.info: dict = {}

    def tail(self, chars: int = 1500) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        lines = [ln for ln in text.splitlines() if "Warning" not in ln and "warnings.warn" not in ln]
        return "\n".join(lines)[-chars:]

    def death(self) -> str:
        code = self.proc.poll()
        return "still running" if code is None else f"exit code {code}"

    def send(self, name: str, args: tuple, kwargs: dict) -> int:
        self.ids += 1
        try:
            self.conn.send((self.ids, name, list(args), kwargs))
        except (OSError, EOFError, ValueError) as exc:
            raise RankError(f"rank {self.rank}'s process is gone ({self.death()}; {exc}); its log ends:\n"
                            f"{self.tail()}") from None
        return self.ids

    def recv(self, rid: int, name: str, deadline: float) -> Any:
        while True:
            left = deadline - time.monotonic()
            try:
                ready = left > 0 and self.conn.poll(left)
            except (OSError, EOFError):
                ready = False
            if not ready:
                state = self.death()
                raise RankError(f"rank {self.rank}'s process did not answer {name} within its bound ({state}); its "
                                f"log ends:\n{self.tail()}")
            try:
                got, status, value = self.conn.recv()
            except (EOFError, OSError):
                time.sleep(0.2)
                raise RankError(f"rank {self.rank}'s process died during {name} ({self.death()}); its log ends:\n"
                                f"{self.tail()}") from None
            if got == rid:
                break
        if status == "err":
            raise RankError(f"rank {self.rank}: {name} raised {value}")
        return value


@attrs.define
class _Req:
    request: StackRequest
    reference: bool
    submitted: float
    deadline: float = 0.0
    admitted: bool = False
    aborted: bool = False
    states: list = attrs.field(factory=list)


class HiCacheStack:
    """See the module docstring."""

    connector = "file"
    vocab = 1024
    #: Nothing to reconnect: once a paused storage answers, the hit query blocked on it returns, the MIN agreement
    #: completes and the queries queued behind it run (measured: every request served right after a `resume` got its
    #: hit, with the sync groups' timeout not passed). A miss after that is SGLang's (`model.stack_oracle`).
    recovery_seconds = 0.0

    def __init__(self, n_ranks: int, *, page_size: int = 4, lookup_timeout: float = 3.0, sync_timeout: float = 10.0,
                 call_timeout: float = 30.0, start_timeout: float = 300.0, host_tokens: int = 512,
                 patches: Sequence[str] = (), backup_wait: float = 1.0, prefetch_policy: str = "timeout") -> None:
        if prefetch_policy not in POLICIES:
            raise ValueError(f"prefetch_policy {prefetch_policy!r}: expected one of {', '.join(POLICIES)}")
        self.prefetch_policy = prefetch_policy
        self.n_ranks, self.chunk_size, self.block_size = n_ranks, page_size, page_size
        #: SGLang takes storage hits in whole pages (of the prompt before its last token).
        self.hit_granule = page_size
        self.lookup_timeout, self.sync_timeout, self.call_timeout = lookup_timeout, sync_timeout, call_timeout
        self.start_timeout, self.host_tokens, self.backup_wait = start_timeout, host_tokens, backup_wait
        self.patches = tuple(patches)
        self.links: list[_Link] = []
        reaper.register(self, self._at_exit)  # (its rank processes killed at exit; none starts once it began)
        self.tmp = Path(reaper.temp_dir("shardcheck-sglang-"))
        self.state = ["up"] * n_ranks
        self.waiting: list[_Req] = []
        self.running: dict[str, _Req] = {}
        self.key_cache: dict[tuple, list[str]] = {}
        self.numel = 0
        self.starts = 0
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    # -- processes -------------------------------------------------------------------------------------------------------
    def _start(self) -> None:
        """Spawn every rank process, wait (within `start_timeout`) until each built its controller."""
        self.starts += 1
        authkey = secrets.token_bytes(16)
        listener = Listener(("127.0.0.1", 0), authkey=authkey)
        port = _free_port()
        env = dict(os.environ, SHARDCHECK_SGL_AUTHKEY=authkey.hex(), PYTHONPATH=str(ROOT),
                   TORCH_EXTENSIONS_DIR=str(Path(sys.prefix) / "shardcheck-cache" / "torch_extensions"),
                   TORCHINDUCTOR_CACHE_DIR=str(self.tmp / "inductor"),  # (not /tmp/torchinductor_USER: left behind)
                   PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                   OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", GLOO_SOCKET_IFNAME="lo", SHARDCHECK_SGL_RANK="1")
        env.pop("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", None)
        host, lport = listener.address
        self.links = []
        try:
            for r in range(self.n_ranks):
                d = self.tmp / f"rank{r}"
                d.mkdir(exist_ok=True)
                log = self.tmp / f"rank{r}.start{self.starts}.log"
                argv = [sys.executable, "-m", "adapters.sglang_hicache.sgl_rank", "--rank", str(r),
                        "--world", str(self.n_ranks), "--port", str(port), "--page", str(self.chunk_size),
                        "--tokens", str(self.host_tokens), "--sync-timeout", str(self.sync_timeout),
                        "--setup-timeout", str(self.start_timeout), "--address", f"{host}:{lport}", "--dir", str(d),
                        "--patches", ",".join(self.patches)]
                with open(log, "wb") as out:
                    proc = SPAWNER.popen(argv, stdin=subprocess_devnull(), stdout=out, stderr=out, cwd=str(ROOT),
                                         env=env)
                self.links.append(_Link(r, proc, log))
            self._accept(listener, time.monotonic() + self.start_timeout)
        finally:
            listener.close()
        self.numel = self.links[0].info["numel"]

    def _accept(self, listener: Any, deadline: float) -> None:
        """Every rank's hello then its ready (or its error), within the deadline; a rank that dies first is named."""
        got: list = []

        def accept() -> None:
            with contextlib.suppress(Exception):
                for _ in range(self.n_ranks):
                    got.append(listener.accept())
        t = threading.Thread(target=accept, name="shardcheck-sglang-accept", daemon=True)
        t.start()
        while t.is_alive() and time.monotonic() < deadline:
            t.join(0.2)
            dead = [ln for ln in self.links if ln.proc.poll() is not None]
            if dead:
                break
        for conn in got:
            if conn.poll(max(0.0, deadline - time.monotonic())):
                kind, rank = conn.recv()
                self.links[rank].conn = conn
        missing = [ln for ln in self.links if ln.conn is None]
        if missing:
            ln = missing[0]
            raise RankError(f"rank {ln.rank}'s process did not connect within {self.start_timeout:g} s "
                            f"({ln.death()}); its log ends:\n{ln.tail()}")
        for ln in self.links:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not ln.conn.poll(min(left, 0.5)):
                    if ln.proc.poll() is not None or left <= 0:
                        raise RankError(f"rank {ln.rank}'s process did not build SGLang's controller within "
                                        f"{self.start_timeout:g} s ({ln.death()}); its log ends:\n{ln.tail()}")
                    continue
                kind, info = ln.conn.recv()
                if kind != "ready":
                    raise RankError(f"rank {ln.rank} could not build SGLang's controller:\n{info}")
                ln.info = info
                break

    def _call_all(self, name: str, *args: Any, per_rank: list[tuple] | None = None, timeout: float | None = None,
                  **kwargs: Any) -> list[Any]:
        """`name` on every rank at once (each rank its own `per_rank` arguments if given), every answer within the
        bound."""
        deadline = time.monotonic() + (timeout or self.call_timeout)
        ids = [ln.send(name, per_rank[ln.rank] if per_rank else args, kwargs) for ln in self.links]
        return [ln.recv(i, name, deadline) for ln, i in zip(self.links, ids)]

    def _call(self, rank: int, name: str, *args: Any, **kwargs: Any) -> Any:
        ln = self.links[rank]
        return ln.recv(ln.send(name, args, kwargs), name, time.monotonic() + self.call_timeout)

    def _at_exit(self) -> None:
        """The exit's stop (`runtime.reaper`): every rank process killed, the run dir removed; what did not end
        raised, for the exit to report."""
        problems = self._kill_all()
        tmp = getattr(self, "tmp", None)
        if tmp is not None:
            reaper.remove_dir(tmp)
        if problems:
            raise RuntimeError("; ".join(problems))

    def _kill_all(self) -> list[str]:
        problems = []
        for ln in self.links:
            if ln.proc.poll() is None:
                kill_spawned(ln.proc)
            if ln.proc.poll() is None:
                problems.append(f"rank {ln.rank}'s process {ln.proc.pid} did not end")
            with contextlib.suppress(Exception):
                if ln.conn is not None:
                    ln.conn.close()
        return problems

    @property
    def info(self) -> list[dict]:
        """What each rank built (its controller class, backend, key suffix, sync groups and their timeout)."""
        return [ln.info for ln in self.links]

    # -- requests ----------------------------------------------------------------------------------------------------------
    def submit(self, request: StackRequest, *, reference: bool = False) -> None:
        self.waiting.append(_Req(request, reference, time.monotonic()))

    def pending(self) -> list[str]:
        return [q.request.id for q in self.waiting] + [rid for rid, q in self.running.items() if not q.aborted]

    def abort(self, request_id: str) -> None:
        self.waiting = [q for q in self.waiting if q.request.id != request_id]
        q = self.running.get(request_id)
        if q is not None:
            q.aborted = True

    def step(self) -> list[StackResult]:
        done: list[StackResult] = []
        admit = [q for q in self.waiting]
        self.waiting = []
        for q in admit:
            if q.reference:
                done.append(self._result(q, None))
                continue
            t = q.request.tokens
            self._call_all("begin", q.request.id, list(t), q.request.tenant)
            q.admitted, q.deadline = True, time.monotonic() + self.lookup_timeout
            self.running[q.request.id] = q
        if self.running:
            done.extend(self._poll())
        if not done:
            time.sleep(0.005)
        return done

    def _poll(self, terminate_all: bool = False) -> list[StackResult]:
        """One lockstep round: the MIN of every queue's size, the drains, the agreed terminations; then every request
        whose prefetch ended on every rank ends."""
        sizes = self._call_all("sizes")
        n_hit, n_ack = (min(s[i] for s in sizes) for i in range(2))
        now = time.monotonic()
        timed = self.prefetch_policy == "timeout"
        terminate = [rid for rid, q in self.running.items()
                     if terminate_all or q.aborted or (timed and now >= q.deadline)]
        states = self._call_all("drain", n_hit, n_ack, terminate)
        done = []
        for rid, q in list(self.running.items()):
            per_rank = [s.get(rid) for s in states]
            if all(s is not None and s["done"] for s in per_rank):
                write = not q.aborted
                t = list(q.request.tokens)
                finished = self._call_all("finish", rid, t, q.request.tenant, write, self.backup_wait,
                                          timeout=self.call_timeout + self.backup_wait)
                del self.running[rid]
                if not q.aborted:
                    done.append(self._result(q, finished))
        return done

    def _span_pages(self, request: StackRequest) -> int:
        return (len(request.tokens) - 1) // self.chunk_size if request.tokens else 0

    def _result(self, q: _Req, finished: list[dict] | None) -> StackResult:
        request, page = q.request, self.chunk_size
        tokens = request.tokens
        pages = self._span_pages(request)
        if finished is None:
            reported, external, loaded = None, 0, [[] for _ in range(self.n_ranks)]
        else:
            hits = [f["hit"] for f in finished if f["hit"] is not None]
            reported = max(hits) if hits else 0
            external = max(f["completed"] or 0 for f in finished)
            loaded = [f["digests"] for f in finished]
        output = []
        for c in range(pages):
            end = tokens[:(c + 1) * page]
            if c < external // page:
                output.append(combine([loaded[r][c] if c < len(loaded[r]) else "not loaded"
                                       for r in range(self.n_ranks)]))
            else:
                output.append(combine([expected(end, r, self.numel) for r in range(self.n_ranks)]))
        output.append(tail_token(tokens))
        seconds = time.monotonic() - q.submitted
        return StackResult(id=request.id, status="finished", output=output, top2=[(-0.1, -3.0)] * len(output),
                           reported=reported, external=external, seconds=seconds, first_token_seconds=seconds)

    # -- observations ------------------------------------------------------------------------------------------------------
    def chunk_keys(self, rank: int, request: StackRequest) -> list[str]:
        key = (rank, request.tokens, request.tenant)
        if key not in self.key_cache:
            self.key_cache[key] = list(self._call(rank, "keys", list(request.tokens), request.tenant))
        return list(self.key_cache[key])

    def _file(self, rank: int, key: str) -> Path:
        return self.tmp / f"rank{rank}" / f"{key}.bin"

    def holdings(self, rank: int, keys: Sequence[str]) -> tuple[list[bool], list[bool] | None]:
        local = [False] * len(keys)
        if self.state[rank] != "up":
            return local, None
        return local, [self._file(rank, k).exists() for k in keys]

    def leaks(self) -> dict:
        if self.running:
            self._poll()
        else:
            self._call_all("drain", *self._mins(), [])
        got = self._call_all("leaks")
        return {"pins": [g["pins"] for g in got], "pinned": sorted({p for g in got for p in g["pinned"]}),
                "free_blocks": sum(g["free"] for g in got), "total_blocks": sum(g["total"] for g in got),
                "threads": [g["threads"] for g in got], "backups": [g["backups"] for g in got]}

    def _mins(self) -> tuple[int, int]:
        sizes = self._call_all("sizes")
        return min(s[0] for s in sizes), min(s[1] for s in sizes)

    # -- faults --------------------------------------------------------------------------------------------------------------
    def evict(self, rank: int, key: str, tier: str) -> None:
        if tier == "remote":
            with contextlib.suppress(FileNotFoundError):
                self._file(rank, key).unlink()

    def _empty(self, rank: int) -> None:
        d = self.tmp / f"rank{rank}"
        for f in d.iterdir() if d.exists() else ():
            with contextlib.suppress(FileNotFoundError):
                f.unlink()

    def fault(self, rank: int, action: str) -> None:
        """A held fault (`model.faults.HELD_ACTIONS`) on the rank's storage gate: no server process to strike, the
        rank's HiCache storage answers as a paused (blocks) or down (fails) server would."""
        self._call(rank, "fault", check_held(action))
        if held_kind(action).loses == "all":  # (kill, restart: the storage comes back empty)
            self._empty(rank)
        self.state[rank] = {"pause": "paused", "kill": "down"}.get(action, "up")

    def reachable(self, rank: int) -> bool:
        return self.state[rank] == "up"

    def reset(self) -> None:
        """Empty every storage, forget every request; start every rank again if one died or lost a storage thread."""
        broken = any(ln.proc.poll() is not None for ln in self.links)
        if not broken:
            try:
                got = self._call_all("reset")
                broken = not all(all(g["threads"].values()) for g in got)
            except RankError:
                broken = True
        for r in range(self.n_ranks):
            self._empty(r)
        self.state = ["up"] * self.n_ranks
        self.waiting, self.running = [], {}
        if broken:
            self._stop_ranks()
            self._start()

    def _stop_ranks(self) -> list[str]:
        problems = []
        for ln in self.links:
            with contextlib.suppress(Exception):
                if ln.proc.poll() is None and ln.conn is not None:
                    ln.send("close", (), {})
        deadline = time.monotonic() + 5.0
        for ln in self.links:
            while ln.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        problems.extend(self._kill_all())
        self.links = []
        return problems

    def close(self) -> list[str]:
        problems = self._stop_ranks()
        reaper.remove_dir(self.tmp)
        reaper.unregister(self)
        return problems


def subprocess_devnull() -> Any:
    import subprocess
    return subprocess.DEVNULL


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def factory(n_ranks: int = 1, *, connector: str = "file", tp: int | None = None, patches: Sequence[str] = (),
            **options: Any) -> HiCacheStack:
    """`--engine sglang-hicache` (`--connector file`; `--engine-option tp=N`: its ranks; `page_size`,
    `lookup_timeout`, `sync_timeout`, `call_timeout`, `start_timeout`, `host_tokens`, `prefetch_policy`)."""
    if connector not in CONNECTORS:
        raise ValueError(f"sglang-hicache runs the storage backend(s) {', '.join(CONNECTORS)}, not {connector!r}")
    return HiCacheStack(tp or n_ranks, patches=patches, **options)
