"""Exit codes and the usage error of the command line."""

__all__ = ["UsageError", "EXIT_HELD", "EXIT_VIOLATED", "EXIT_USAGE", "EXIT_UNDECIDED"]

EXIT_HELD, EXIT_VIOLATED, EXIT_USAGE = 0, 1, 2
#: The harness could not judge (`model.timing.HarnessOutcome`: the machine starved it, or its own set-up was too slow).
EXIT_UNDECIDED = 4


class UsageError(Exception):
    """Unusable input (a bad spec, a malformed trace, a dead server): exit 2 with this message."""
