"""The documents point only inside the repository, and every path and module they name exists: a file or directory
(`engines/retention.py`, `docs/CONTRACT.md`), a module or an attribute of one (`engines.scenarios`,
`model.contract.ShardingProtocol`), a `MOD:ATTR` (`properties.bad_stores:crossed_replies_factory`), a link."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "ARCHITECTURE.md", "properties/README.md", "counterexamples/README.md", "adapters/README.md",
        "tools/porcupine/README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
PACKAGES = ("model", "runtime", "engines", "proofs", "properties", "adapters", "shardcheck", "tests")
TOP_DIRS = PACKAGES + ("docs", "counterexamples", "requirements", "tools")
#: Paths that runs create (not in a clone): where counterexamples and plots are written.
MADE_BY_RUNS = ("counterexamples/found", "shardcheck-tier", "out")
#: Names of a user's own modules in the documents' examples (a user writes them).
USERS_MODULES = ("mymod", "myfix", "my.module", "my_client")


def _prose(text: str) -> str:
    """The document without its fenced code blocks (commands and a user's example modules)."""
    return re.sub(r"```.*?```", "", text, flags=re.S)


def _spans(doc: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", _prose((ROOT / doc).read_text()))


def _links(doc: str) -> list[str]:
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", _prose((ROOT / doc).read_text()))
            if not re.match(r"[a-z]+://|#|mailto:", t)]


def _path_of(span: str) -> str | None:
    """The repository path a code span names, or None (a command, a placeholder, a pattern)."""
    span = span.split(":")[0] if re.match(r"^[\w./-]+\.py:\w", span) else span
    if re.search(r"[\s<>*{}|$]", span) or span.startswith(("-", ".venv")):
        return None
    first = span.split("/")[0]
    if "/" in span and first in TOP_DIRS or re.fullmatch(r"[\w-]+\.(md|toml|txt)", span) or span == "Makefile":
        return span.rstrip("/")
    return None


def _module_of(span: str) -> str | None:
    """A dotted module (or attribute) name or a `MOD:ATTR` a span names in one of the project's packages, or None."""
    name = re.split(r"[(\[ ]", span)[0]
    if not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_]\w*)+(:[A-Za-z_][\w.]*)?|[A-Za-z_]\w*:[A-Za-z_][\w.]*", name):
        return None
    return name if name.split(".")[0].split(":")[0] in PACKAGES else None


def _resolves(name: str) -> bool:
    mod, _, attr = name.partition(":")
    parts = mod.split(".")
    for i in range(len(parts), 0, -1):  # the longest importable prefix; the rest are attributes
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in [*parts[i:], *(attr.split(".") if attr else [])]:
            if not hasattr(obj, part):
                return False
            obj = getattr(obj, part)
        return True
    return False


@pytest.mark.parametrize("doc", DOCS)
def test_a_document_points_only_inside_the_repository(doc):
    text = (ROOT / doc).read_text()
    assert "../shared" not in text and "/work/" not in text, doc
    for target in _links(doc):
        assert (ROOT / doc).parent.joinpath(target.split("#")[0]).resolve().exists(), f"{doc}: link {target}"


def _bare_file_exists(doc: str, span: str) -> bool | None:
    """For a bare file name (`valkey_servers.py`, `test_store_layer.py`): whether it is in the document's directory or
    anywhere in the repository's packages; None for a span that is no bare file name."""
    name = span.split(":")[0]
    if not re.fullmatch(r"[\w-]+\.(py|json)", name):
        return None
    return (ROOT / doc).parent.joinpath(name).exists() or any(
        p for pkg in TOP_DIRS for p in (ROOT / pkg).rglob(name) if ".venv" not in p.parts)


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_and_module_a_document_names_exists(doc):
    missing = []
    for span in _spans(doc):
        bare = _bare_file_exists(doc, span)
        if bare is not None:
            if not bare:
                missing.append(span)
            continue
        path = _path_of(span)
        if path is not None:
            if not path.startswith(MADE_BY_RUNS) and not (ROOT / path).exists():
                missing.append(path)
            continue
        name = _module_of(span)
        if name is not None and not name.startswith(USERS_MODULES) and not _resolves(name):
            missing.append(name)
    assert missing == [], f"{doc} names what does not exist: {missing}"


def test_the_check_finds_what_does_not_exist():
    """The test itself fails on a missing path, a missing module attribute and a missing MOD:ATTR."""
    assert _path_of("properties/resolve.py") == "properties/resolve.py" and not (ROOT / "properties/resolve.py").exists()
    assert _module_of("engines.scenarios.run_scenarios") and _resolves("engines.scenarios.run_scenarios")
    assert not _resolves("engines.scenarios.no_such_thing") and not _resolves("properties.bad_stores:nope_factory")
    assert _path_of("pytest properties/ --client x") is None and _module_of("MOD:ATTR") is None
    assert _bare_file_exists("properties/README.md", "resolve.py") is False
    assert _bare_file_exists("adapters/README.md", "valkey_servers.py") is True
