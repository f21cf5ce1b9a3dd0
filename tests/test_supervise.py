"""The backstop for protocol code stuck in C: `check` ends with exit 3, a stack and one line, at its deadline."""
import textwrap

from tests.conftest import run_cli


def test_a_lookup_stuck_in_c_ends_check_with_exit_3(tmp_path, monkeypatch):
    """A catastrophic regular expression in rank_lookup (the watchdog cannot run) ends check with exit 3."""
    (tmp_path / "stuck.py").write_text(textwrap.dedent('''
        import re
        from model.protocols import PaperProtocol

        class RegexLookup(PaperProtocol):
            name = "regex-lookup"

            def rank_lookup(self, rank, n_ranks, chunk_hashes, contains):
                re.match(r"(a+)+$", "a" * 64 + "b")  # backtracks for ages, in C
                return super().rank_lookup(rank, n_ranks, chunk_hashes, contains)
    '''))
    monkeypatch.setenv("SHARDCHECK_SUPERVISOR_GRACE", "2")
    r = run_cli("check", "--protocol", "stuck:RegexLookup", "--budget", "2", "--out", str(tmp_path / "o"),
                env_extra=[str(tmp_path)], timeout=60)
    assert r.returncode == 3, r.stderr
    assert "stuck.py" in r.stderr and "rank_lookup" in r.stderr  # the child's stack, from faulthandler
    assert r.stderr.rstrip().endswith("ended the run (exit 3)")


def test_a_supervised_check_passes_its_exit_status_and_output_through(tmp_path):
    """A check that ends by itself keeps its exit status and its JSON output under the supervisor."""
    r = run_cli("check", "--protocol", "model.variants:MaxCombine", "--budget", "2", "--json",
                "--out", str(tmp_path), timeout=60)
    assert r.returncode == 1 and '"verdict": "violated"' in r.stdout, r.stderr
