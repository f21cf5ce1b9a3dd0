"""`shardcheck campaign`: pytest-xdist workers sharing Hypothesis's Redis-protocol example database on Valkey."""
import redis

from tests.conftest import run_cli


def test_a_campaign_shares_its_failures_through_valkey(shardcheck_servers, tmp_path):
    """Two workers on a protocol bug fail, and the failing examples are saved in the Valkey database they share."""
    url = f"redis://127.0.0.1:{shardcheck_servers.ports[0]}"
    r = run_cli("campaign", "--url", url, "--workers", "2", "--profile", "dev", "--", "--protocol",
                "model.variants:MaxCombine", "--found-dir", str(tmp_path), timeout=300)
    assert r.returncode == 1 and "SoundnessViolated" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    keys = redis.Redis(port=shardcheck_servers.ports[0]).keys(b"shardcheck-examples*")
    assert keys, "no example was saved in the shared database"


def test_an_unreachable_database_is_one_line_and_exit_2():
    """A --url where no server answers is refused before any worker starts."""
    r = run_cli("campaign", "--url", "redis://127.0.0.1:1", timeout=60)
    assert r.returncode == 2 and "redis://127.0.0.1:1" in r.stderr and len(r.stderr.strip().splitlines()) == 1
