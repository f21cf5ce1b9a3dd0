"""`shardcheck tier`: a measurement against servers started separately, bad input, an unreachable server."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from adapters.tier_measure import parse_url, ping
from adapters.valkey_servers import free_port, start_servers
from model.cost import hit_threshold_tokens
from shardcheck.tier_cmd import PRESETS, bytes_per_token, verdict

ROOT = Path(__file__).resolve().parents[1]


def _tier(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "shardcheck", "tier", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.real
def test_tier_against_user_servers_given_as_urls(tmp_path):
    """With two servers started separately: shared at N=1..8, per rank at N=1,2, plots, a verdict, keys removed."""
    servers = start_servers(2)
    try:
        r = _tier("--url", servers.url(0, "redis"), "--url", servers.url(1, "redis"), "--bytes-per-token", "1000",
                  "--seconds", "0.2", "--plots", str(tmp_path), "--json")
        assert r.returncode == 0, r.stderr[-2000:]
        out = json.loads(r.stdout)
        bw = out["measured"]["bandwidth"]
        assert sorted(bw["shared"], key=int) == ["1", "2", "4", "8"] and sorted(bw["per_rank"]) == ["1", "2"]
        assert all(b > 0 for series in bw.values() for b in series.values())
        assert out["model"]["chunk_bytes"] == 256_000 and out["measured"]["source"] == "url"
        v = out["verdict"]
        for row in v["by_setup"].values():
            assert row["pays"] == (row["B"] > v["B_star"])
            assert row["break_even_tokens"] == hit_threshold_tokens(1000, PRESETS["paper"]["R"], row["B"], v["T0"])
        assert {Path(p).name for p in out["plots"]} == {f"tier-{n}.{e}" for n in ("hit-vs-recompute", "bandwidth")
                                                        for e in ("png", "svg")}
        assert all(Path(p).stat().st_size > 0 for p in out["plots"])
        for port in servers.ports:  # the measurement's keys are gone from the user's servers
            from adapters.tier_measure import _resp
            assert _resp("127.0.0.1", port, None, "DBSIZE").strip() == b":0"
    finally:
        servers.stop()


def test_unreachable_server_is_exit_2_with_one_line(tmp_path):
    """A --url nobody answers on: exit 2 and one line naming the server, nothing measured."""
    port = free_port()
    r = _tier("--url", f"redis://127.0.0.1:{port}", "--plots", str(tmp_path), timeout=60)
    assert r.returncode == 2
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert lines == [f"shardcheck tier: error: server 127.0.0.1:{port} does not answer PING"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, names", [(["--bytes-per-token", "-1"], "--bytes-per-token"),
                                         (["--chunk-tokens", "0"], "--chunk-tokens"),
                                         (["--url", "nohost"], "--url 'nohost'"),
                                         (["--engine", "sglang-hicache"], "tier --engine 'sglang-hicache'"),
                                         (["--engine", "vllm", "--url", "127.0.0.1:1"], "--url does not apply")])
def test_bad_input_is_exit_2_naming_it(args, names, tmp_path):
    """A non-positive figure or a URL without host:port is exit 2 with a message naming the option."""
    r = _tier(*args, "--plots", str(tmp_path), timeout=60)
    assert r.returncode == 2 and names in r.stderr


def test_model_shapes_and_verdict_follow_the_cost_model():
    """Bytes/token is layers x KV heads x head dim x 2 x dtype bytes; the verdict is model.cost's."""
    assert bytes_per_token(32, 8, 128, 2) == 131072 == PRESETS["llama-3.1-8b"]["s"]
    assert PRESETS["paper"]["s"] * PRESETS["paper"]["R"] == pytest.approx(2.53e9, rel=2e-3)
    v = verdict(s=48.4e3, R=52.2e3, T0=0.33, bandwidths={"slow": 1.71e9, "fast": 10.76e9}, lam=1.21,
                hit_bytes=0.79e9)
    assert v["by_setup"]["slow"]["break_even_tokens"] is None and not v["by_setup"]["slow"]["pays"]
    assert v["by_setup"]["fast"]["break_even_tokens"] > v["floor_tokens"] == pytest.approx(52.2e3 * 0.33)
    assert v["by_setup"]["slow"]["rho"] == pytest.approx(1.21 * 0.79e9 / 1.71e9)


def test_parse_url_and_ping():
    """URLs give host, port and password; a closed port does not answer PING."""
    assert parse_url("redis://:pw@127.0.0.1:6380") == ("127.0.0.1", 6380, "pw")
    assert parse_url("127.0.0.1:7000") == ("127.0.0.1", 7000, None)
    assert not ping("127.0.0.1", free_port(), None)
