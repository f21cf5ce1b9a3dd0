"""Exit codes and the usage error of the command line."""

__all__ = ["UsageError"]

EXIT_HELD, EXIT_VIOLATED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Unusable input (a bad spec, a malformed trace, a dead server): exit 2 with this message."""
