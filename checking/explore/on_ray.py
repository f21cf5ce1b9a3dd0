"""Shards as Ray tasks, on an existing cluster (`address`) or a local one (`"auto"`, sized to the machine).

Every wait is bounded (`ray.wait` with `TICK`); a task whose worker dies is retried by Ray (`max_retries`), one
that raises is retried too (`retry_exceptions`), and a shard that still fails is reported in `failed_shards`
(verdict "incomplete"). `timeout` bounds the whole run. On Ctrl-C or any error every task is cancelled
(`force=True` ends its worker process) and a cluster this call started is shut down. When Ray is already
initialised in this process, its cluster is used and left running.
Workers import shardcheck from the driver's source tree (`PYTHONPATH` in the runtime environment) on a local
cluster; on a remote cluster shardcheck must be installed on every node. An address whose port does not accept
a connection within `CONNECT_SECONDS` is refused before Ray is asked (it would retry for minutes).
"""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any, Callable

from runtime.watchdog import STALL_SECONDS, watching

from checking.explore.result import ExploreError, ExploreResult
from checking.explore.shards import ShardResult, ShardSpec, incomplete, merge, run_shard

__all__ = ["explore_ray", "TICK"]

#: Seconds of one bounded wait on the tasks.
TICK = 0.5
#: Seconds to wait for a cluster address to accept a connection.
CONNECT_SECONDS = 5.0
#: The source tree the workers import shardcheck from.
ROOT = str(Path(__file__).resolve().parents[2])


def _shard_task(spec: ShardSpec, index: int, count: int, stall_seconds: float) -> ShardResult:
    """One shard in a Ray worker, with protocol calls watched as in one process."""
    with watching(stall_seconds):
        return run_shard(spec, index, count)


def explore_ray(spec: ShardSpec, address: str | None, *, workers: int | None = None, shards: int | None = None,
                retries: int = 1, timeout: float | None = None, stall_seconds: float = STALL_SECONDS,
                progress: Callable[[dict], None] | None = None) -> ExploreResult:
    """Explore `spec` as Ray tasks (`shards` of them; default: `workers`, else the cluster's CPUs), merged.

    `address`: "auto" starts a local cluster with `workers` CPUs (default: this machine's), any other string
    connects to that cluster, None uses the cluster this process is already connected to.
    """
    try:
        import ray
    except ImportError:
        raise ExploreError("--ray needs the ray package (pinned in requirements/base.txt)") from None
    started = False
    if not ray.is_initialized():
        if address is None:
            raise ExploreError("Ray is not initialised and no address was given")
        env = {"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}}
        try:
            if address == "auto":
                ray.init(num_cpus=workers or os.cpu_count() or 1, include_dashboard=False, log_to_driver=False,
                         runtime_env=env)
            else:
                _reachable(address)
                ray.init(address=address, log_to_driver=False, runtime_env=env)
        except ExploreError:
            raise
        except Exception as exc:  # noqa: BLE001 - an unreachable or bad address is unusable input
            raise ExploreError(f"--ray {address!r}: cannot start or reach the Ray cluster: {exc}") from None
        started = True
    t0 = time.perf_counter()
    pending: dict[Any, int] = {}
    try:
        cpus = int(ray.cluster_resources().get("CPU", 1))
        count = shards or workers or max(1, cpus)
        task = ray.remote(num_cpus=1, max_retries=retries, retry_exceptions=True)(_shard_task)
        pending = {task.remote(spec, i, count, stall_seconds): i for i in range(count)}
        results: dict[int, ShardResult] = {}
        failed: list[tuple[int, str]] = []
        while pending:
            if timeout is not None and time.perf_counter() - t0 > timeout:
                failed.extend((i, f"timed out after {timeout:g} s") for i in pending.values())
                _cancel(ray, pending)
                break
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=TICK)
            for ref in ready:
                index = pending.pop(ref)
                try:
                    results[index] = ray.get(ref, timeout=TICK)
                except Exception as exc:  # noqa: BLE001 - a shard that kept failing: reported, never lost
                    failed.append((index, f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [type(exc).__name__])[-1][:300]}"))
            if progress is not None:
                progress({"states": sum(r.states for r in results.values()), "shards": count, "done": len(results),
                          "failed": len(failed), "workers": min(count, cpus)})
    except BaseException:
        _cancel(ray, pending)
        raise
    finally:
        if started:
            ray.shutdown()
    wall = time.perf_counter() - t0
    if failed:
        return incomplete(list(results.values()), failed, seconds=wall, workers=min(count, cpus))
    return merge(spec, [results[i] for i in range(count)], seconds=wall, workers=min(count, cpus))


def _reachable(address: str) -> None:
    """Refuse an address whose host:port does not accept a TCP connection within `CONNECT_SECONDS` (Ray itself
    would retry for minutes)."""
    hostport = address.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ExploreError(f"--ray {address!r}: expected auto or HOST:PORT (or ray://HOST:PORT)")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_SECONDS).close()
    except OSError as exc:
        raise ExploreError(f"--ray {address!r}: cannot reach {host}:{port} within {CONNECT_SECONDS:g} s ({exc})") from None


def _cancel(ray: Any, pending: dict) -> None:
    """Cancel every pending task (ending its worker process)."""
    for ref in list(pending):
        try:
            ray.cancel(ref, force=True)
        except Exception:  # noqa: BLE001 - already finished or gone
            pass
    pending.clear()
