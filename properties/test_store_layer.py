"""The store-client layer against `--client` (default: the in-memory `model` client)."""
from properties.machines import StoreMachine


class TestStoreLayer(StoreMachine.TestCase):
    """Every client call answers promptly and like the oracle, over every read path, and leaves the client usable."""
