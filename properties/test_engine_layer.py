"""The engine layer against `--engine NAME` (stock `lmcache`, `lmcache-patched` or a deployment factory): the
engine state machine over a real engine's own lookup-and-load path. Without `--engine` it does not run (it needs a
real serving engine: `pytest properties/ --engine lmcache`)."""
import pytest
from hypothesis import settings

from properties import config, profiles
from properties.engine_machine import EngineMachine

pytestmark = pytest.mark.skipif(config.current().engine is None,
                                reason="the engine layer checks a serving engine: pytest properties/ --engine NAME")

#: Examples per profile: each example deploys a real engine (a second or so with its steps).
EXAMPLES = {"dev": 8, "ci": 12, "nightly": 200}


class TestEngineLayer(EngineMachine.TestCase):
    """Engine steps in vLLM's order: lookups answer the minimum over ranks, retrieves the stored bytes, pins are
    released, every call returns, requests stay isolated."""

    settings = settings(settings(), max_examples=EXAMPLES.get(profiles.chosen(), 8),
                        stateful_step_count=14, deadline=None)
