"""The explorer's manifest (`checking/manifest.json`): configurations with their expected verdict and
distinct-state count, checked in CI (`tests/test_explore.py`), in the manner of tlaplus/Examples manifests.
`shardcheck regen manifest` re-runs every entry and rewrites its expectations (`--check`: report drift only).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from checking.explore import explore
from model.outcome import OtherPrompt
from runtime.registry import load_attr

__all__ = ["MANIFEST", "SCHEMA", "VERSION", "REGENERATE", "REFERENCE", "REFERENCE_CONFIGS", "VARIANT_CONFIGS",
           "VARIANTS_FULL", "VARIANT_OTHERS", "resolve", "entry_name", "default_entries", "run_entry", "observed", "load", "update",
           "check"]

MANIFEST = Path(__file__).with_name("manifest.json")
SCHEMA = "shardcheck-explore-manifest"
VERSION = 1
REGENERATE = "shardcheck regen manifest"

REFERENCE = ("model.protocols:PaperProtocol", "model.protocols:PaperProtocolAsync",
             "model.protocols:Rank0SingleWriter")
#: (n_ranks, n_chunks, cached, max_faults, reduction) explored for every reference protocol.
REFERENCE_CONFIGS = (
    (2, 3, "all", 1, True), (2, 3, "all", 1, False),
    (3, 2, "all", 1, True), (3, 2, "all", 1, False),
    (3, 4, "all", 0, True), (3, 4, [0, 1, 2], 1, True),
    (3, 5, "all", 2, True), (3, 5, "all", 2, False),
    (4, 6, "all", 1, True), (4, 6, "all", 1, False),
)
#: demo variant -> (n_ranks, n_chunks): a small configuration where the explorer finds its property.
VARIANT_CONFIGS = {
    "OwnCountReport": (2, 3), "EmptyRankReportsZero": (3, 2), "MaxCombine": (2, 3),
    "MismatchedOwnership": (2, 3), "GappyLoad": (2, 3), "GiveUpOnLocalMiss": (2, 3),
    "AlignedPlanGreedyLoad": (2, 3), "ByteOffByOne": (2, 3), "PessimisticLoad": (2, 3),
    "EarlyExitOnMiss": (2, 3), "SkipEmptyGather": (2, 3), "UnboundedWaitAsync": (2, 3),
    "RetryUntilPresent": (2, 3), "WrongAsyncKey": (2, 3),
    "PositionKeys": (2, 2), "PositionKeyedLoad": (2, 2), "PositionMarkedLookup": (2, 2),
}
#: demo variant -> the other prompts in the tier its configuration needs (`config.others` of a trace).
VARIANT_OTHERS = {
    "PositionKeys": [{"n_chunks": 2, "after": True}],
    "PositionKeyedLoad": [{"n_chunks": 2, "after": True}],
    "PositionMarkedLookup": [{"n_chunks": 2, "after": True, "evicted": [1]}],
}
#: variants also explored without reduction (the full interleaving space). Every entry with every cached set
#: is also explored with the lazy initial state (`"lazy": true`, its own state count, the same verdict).
VARIANTS_FULL = ("EarlyExitOnMiss", "SkipEmptyGather", "UnboundedWaitAsync", "GiveUpOnLocalMiss")


def resolve(ref: str) -> Any:
    """`MOD:ATTR` -> a protocol instance (a class is instantiated with no arguments)."""
    obj = load_attr(ref, "protocol")
    return obj() if isinstance(obj, type) else obj


def entry_name(e: dict) -> str:
    cached = "all" if e["cached"] == "all" else "c" + "".join(map(str, e["cached"]))
    proto = e["protocol"].rpartition(":")[2]
    prop = f"-{'+'.join(e['properties'])}" if e.get("properties") else ""
    others = f"-o{len(e['others'])}" if e.get("others") else ""
    return (f"{proto}-{e['n_ranks']}x{e['n_chunks']}-{cached}-f{e['max_faults']}-"
            f"{'por' if e['reduction'] else 'full'}{'-lazy' if e.get('lazy') else ''}{others}{prop}")


def default_entries() -> list[dict]:
    from model.variants import DEMO_VARIANTS
    out = []
    for ref in REFERENCE:
        for n, k, cached, f, red in REFERENCE_CONFIGS:
            out.append({"protocol": ref, "n_ranks": n, "n_chunks": k, "cached": cached, "max_faults": f,
                        "reduction": red})
    for cls, prop in DEMO_VARIANTS.items():
        n, k = VARIANT_CONFIGS.get(cls.__name__, (2, 3))
        for red in (True, False) if cls.__name__ in VARIANTS_FULL else (True,):
            out.append({"protocol": f"{cls.__module__}:{cls.__name__}", "n_ranks": n, "n_chunks": k,
                        "cached": "all", "max_faults": 1, "reduction": red, "properties": [prop],
                        **({"others": VARIANT_OTHERS[cls.__name__]} if cls.__name__ in VARIANT_OTHERS else {})})
    # the lazy initial state: same verdicts (it does not cover other prompts in the tier)
    out += [{**e, "lazy": True} for e in out if e["cached"] == "all" and not e.get("others")]
    return [{"name": entry_name(e), **e} for e in out]


def run_entry(e: dict):
    """Explore one manifest entry."""
    return explore(resolve(e["protocol"]), e["n_ranks"], e["n_chunks"],
                   cached=None if e["cached"] == "all" else e["cached"], max_faults=e["max_faults"],
                   reduction=e["reduction"], properties=e.get("properties"), lazy=e.get("lazy", False),
                   others=[OtherPrompt(**{**o, "evicted": tuple(o.get("evicted", ()))}) for o in e.get("others", ())])


def observed(res) -> dict:
    """What the manifest records of a result."""
    out = {"verdict": res.verdict, "states": res.states}
    if res.verdict == "violated":
        out["property"] = res.violation.property
        out["depth"] = res.depth
    return out


def load(path: Path = MANIFEST) -> dict:
    data = json.loads(Path(path).read_text())
    if data.get("schema") != SCHEMA or data.get("version") != VERSION:
        raise ValueError(f"{path}: not a {SCHEMA} v{VERSION} file")
    return data


def update(path: Path = MANIFEST, entries: list[dict] | None = None, out=sys.stdout) -> dict:
    """Re-run every entry (of `entries`, or of the manifest at `path`) and write the expectations."""
    if entries is None:  # the manifest's entries, then every default entry it does not have yet
        entries = load(path)["entries"] if Path(path).exists() else []
        entries += [e for e in default_entries() if e["name"] not in {x["name"] for x in entries}]
    new = []
    for e in entries:
        e = {"name": e.get("name") or entry_name(e)} | {k: v for k, v in e.items() if k not in ("name", "expect")}
        e["expect"] = observed(run_entry(e))
        new.append(e)
        print(f"{e['name']}: {e['expect']}", file=out)
    data = {"schema": SCHEMA, "version": VERSION,
            "about": "Exhaustive explorer configurations with the expected verdict and distinct-state count; "
                     f"checked by tests/test_explore.py. Regenerate with `{REGENERATE}`.",
            "entries": new}
    Path(path).write_text(json.dumps(data, indent=1) + "\n")
    return data


def check(path: Path = MANIFEST, out=sys.stdout) -> int:
    """0 when every entry still gives its expectations and every default entry is there, 1 otherwise (each drift
    printed)."""
    bad = 0
    entries = load(path)["entries"]
    for e in default_entries():
        if e["name"] not in {x["name"] for x in entries}:
            bad += 1
            print(f"DRIFT {e['name']}: missing from the manifest", file=out)
    for e in entries:
        got = observed(run_entry(e))
        if got != e["expect"]:
            bad += 1
            print(f"DRIFT {e['name']}: expected {e['expect']}, got {got}", file=out)
    if bad:
        print(f"{bad} entries drifted; if intended, regenerate with `{REGENERATE}`", file=out)
    return 1 if bad else 0
