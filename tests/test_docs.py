"""The documents point only inside the repository, and every path and module they name exists: a file or directory
(`checking/retention.py`, `docs/CONTRACT.md`), a module or an attribute of one (`checking.scenarios`,
`model.contract.ShardingProtocol`), a `MOD:ATTR` (`properties.bad_stores:crossed_replies_factory`), a link.

The docs site (`mkdocs.yml`, pages in docs/) builds with `mkdocs build --strict`: a broken link or anchor, or a page
missing from the nav or left out of it, fails. And every package's README lists every one of its modules (every
`*.py` but `__init__.py`, subpackages included) in a code span, by its path from the README's folder
(`check.py`, `explore/bfs.py`), and lists none that does not exist."""
from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The packages whose README lists their modules: every top-level folder with an `__init__.py` but the tests.
MODULE_PACKAGES = sorted(p.parent.name for p in ROOT.glob("*/__init__.py") if p.parent.name != "tests")
#: Every document: the top-level ones, each package's README and every page of docs/ (its symlinks, which show a
#: README or ARCHITECTURE.md in the site, are checked as the file they point to).
DOCS = ["README.md", "ARCHITECTURE.md", "counterexamples/README.md", "tools/porcupine/README.md",
        *(f"{pkg}/README.md" for pkg in MODULE_PACKAGES),
        *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md") if not p.is_symlink())]
PACKAGES = ("model", "runtime", "checking", "proofs", "properties", "adapters", "shardcheck", "tests")
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
    assert _module_of("checking.scenarios.run_scenarios") and _resolves("checking.scenarios.run_scenarios")
    assert not _resolves("checking.scenarios.no_such_thing") and not _resolves("properties.bad_stores:nope_factory")
    assert _path_of("pytest properties/ --client x") is None and _module_of("MOD:ATTR") is None
    assert _bare_file_exists("properties/README.md", "resolve.py") is False
    assert _bare_file_exists("adapters/README.md", "valkey_servers.py") is True


def _modules(folder: Path) -> list[str]:
    """Every module of a package folder, subpackages included, as its path from the folder (`explore/bfs.py`)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*.py")
                  if p.name != "__init__.py" and "__pycache__" not in p.parts)


def _unlisted(folder: Path) -> list[str]:
    """The modules of `folder` that its README does not name in a code span (by their path from the folder, their path
    from the repository's root, or their dotted name); all of them when there is no README."""
    readme = folder / "README.md"
    spans = {s.split()[0] for s in re.findall(r"`([^`\n]+)`", _prose(readme.read_text()))} if readme.exists() else set()
    def named(rel: str) -> bool:
        full = f"{folder.name}/{rel}"
        return bool({rel, full, full[:-3].replace("/", ".")} & spans)
    return [rel for rel in _modules(folder) if not named(rel)]


def _listed_but_missing(folder: Path) -> list[str]:
    """The modules a README's tables list (a row's first cell, `x.py`) that are not in its folder."""
    text = (folder / "README.md").read_text()
    return [m for m in re.findall(r"^\| `([\w/]+\.py)` \|", text, flags=re.M) if not (folder / m).is_file()]


@pytest.mark.parametrize("pkg", MODULE_PACKAGES)
def test_every_module_is_listed_in_its_folders_readme(pkg):
    assert (ROOT / pkg / "README.md").exists(), f"{pkg}/ has no README.md listing its modules"
    assert _unlisted(ROOT / pkg) == [], (
        f"{pkg}/README.md does not list these modules (one line each, by their path from {pkg}/)")
    assert _listed_but_missing(ROOT / pkg) == [], f"{pkg}/README.md lists modules that do not exist"


def test_the_module_list_check_finds_an_unlisted_module(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    for name in ("__init__.py", "a.py", "b.py", "sub/__init__.py", "sub/c.py", "sub/d.py"):
        (pkg / name).write_text("")
    assert _unlisted(pkg) == ["a.py", "b.py", "sub/c.py", "sub/d.py"]  # no README: every module unlisted
    (pkg / "README.md").write_text("| module | what |\n|---|---|\n| `a.py` | A |\n| `sub/c.py` | C |\n"
                                   "| `gone.py` | renamed |\n\nAlso `pkg.sub.d`.\n```\n`b.py` in a code block\n```\n")
    assert _unlisted(pkg) == ["b.py"]
    assert _listed_but_missing(pkg) == ["gone.py"]


def test_the_docs_site_builds_strict(tmp_path):
    """`mkdocs build --strict` (mkdocs.yml: every link, anchor and nav entry checked) into a temporary directory."""
    pytest.importorskip("mkdocs", reason="mkdocs is installed by `make venv` (requirements/docs.txt)")
    before = set(ROOT.iterdir())
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                          "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{run.stdout}\n{run.stderr}"
    assert (tmp_path / "site" / "index.html").exists()
    assert set(ROOT.iterdir()) == before, "the build left files in the repository"

