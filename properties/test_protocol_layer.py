"""The protocol layer against `--protocol` over `--client` (default: the reference PaperProtocol, in memory)."""
from properties.machines import ProtocolMachine


class TestProtocolLayer(ProtocolMachine.TestCase):
    """Every contract property holds in every episode the rules build (store, evict, look up, load, faults)."""
