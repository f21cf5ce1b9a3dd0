"""Exit codes and the usage error of the command line."""

__all__ = ["UsageError", "EXIT_HELD", "EXIT_VIOLATED", "EXIT_USAGE", "EXIT_UNDECIDED"]

EXIT_HELD, EXIT_VIOLATED, EXIT_USAGE = 0, 1, 2
#: The harness could not judge (CONTRACT.md, "Timing, and outcomes that are the harness's"): `check` when the machine
#: starved it or its own set-up was too slow (`model.timing.HarnessOutcome`); `replay` when a row is `undecided` (a
#: controlled replay that its bound ended) and none reproduces or is an error.
EXIT_UNDECIDED = 4


class UsageError(Exception):
    """Unusable input (a bad spec, a malformed trace, a dead server): exit 2 with this message."""
