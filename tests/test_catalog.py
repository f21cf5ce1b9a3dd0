"""The property catalog: every property of every layer has a record, a check or an engine, and a demo."""
import ast
import importlib.util
import inspect
from pathlib import Path

from model import checks, protocols, variants
from model.checks import CATALOG, CHECKS, PROPERTIES
from runtime.registry import demo_refs, load_attr, patch_refs
from shardcheck.tables import DEMO_MODULES, SERVING_ENGINES


def test_every_property_has_a_resolvable_demo():
    """Each record names at least one known-bad demo, and every demo resolves to a class or factory (a stack demo, a
    KV connector class, is looked for in its module's source: importing it imports vLLM, which must not share a
    process with LMCache's own engines)."""
    assert len({p.name for p in CATALOG}) == len(CATALOG)
    for p in CATALOG:
        assert p.layer in DEMO_MODULES and p.about and p.demos, p
        for ref in demo_refs(p, DEMO_MODULES):
            if p.layer == "stack":
                module, name = ref.split(":")
                spec = importlib.util.find_spec(module)
                tree = ast.parse(Path(spec.origin).read_text())
                assert name in {n.name for n in tree.body if isinstance(n, ast.ClassDef)}, ref
            else:
                assert callable(load_attr(ref, "demo")), ref


def test_every_stack_patch_demo_resolves_and_has_a_stack():
    """A property's `--engine-patch` demos of a stack's own agreement are functions (importing their module imports
    nothing of the stack: they patch it in its rank processes), and some stack takes them."""
    refs = [ref for p in CATALOG for ref in patch_refs(p, DEMO_MODULES)]
    assert refs and all(callable(load_attr(ref, "demo")) for ref in refs)
    assert [p.name for p in CATALOG if p.patches] == ["engine-soundness"]
    assert [name for name, e in SERVING_ENGINES.items() if e.patch_demos] == ["sglang-hicache"]


def test_every_demo_variant_class_is_in_the_catalog():
    """Every protocol class `model.variants` defines (beyond the reference ones) is some property's demo."""
    defined = {c for _, c in inspect.getmembers(variants, inspect.isclass)
               if c.__module__ == variants.__name__}
    assert defined == set(variants.DEMO_VARIANTS)
    assert not set(variants.DEMO_VARIANTS) & {c for _, c in inspect.getmembers(protocols, inspect.isclass)}


def test_checks_follow_the_catalog():
    """The protocol checks run in catalog order, and each protocol property is found by a check or the simulator."""
    assert [c.__name__ for c in CHECKS] == ["isolation_lookup", "isolation_eviction", "isolation_load",
                                             "key_consistency", "soundness", "run_faults", "prefix", "agreement",
                                             "within_plan", "integrity", "completeness", "maximality"]
    simulator_found = {p.name for p in CATALOG if p.layer == "protocol" and p.check is None}
    assert simulator_found == {"desync", "deadlock", "hang", "termination"}
    assert set(PROPERTIES) == {p.name for p in CATALOG if p.layer == "protocol"}
    assert all(getattr(checks, c.__name__) is c for c in CHECKS)
