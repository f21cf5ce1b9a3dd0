"""Engine patches of the in-memory stack for the stack pipeline's tests (`--engine-patch tests.stack_patches:NAME`):
each runs in the subprocess of a `shardcheck` command, never in the test process."""
from __future__ import annotations

from model.stack_memory import MemoryStack


def max_over_ranks() -> None:
    """The lookup takes the maximum over ranks instead of the minimum: the paper's claim broken."""
    def lookup(self, request):  # type: ignore[no-untyped-def]
        chunks = max(self._held(r, self.chunk_keys(r, request)) for r in range(self.n_ranks))
        return max(0, min(chunks * self.chunk_size, len(request.tokens) - 1))
    MemoryStack.lookup = lookup  # type: ignore[method-assign]
