"""The error a user can fix: bad input or params. Every stage prints its message alone, one line that
names the file or key and says what to do, and exits 2 (lib/core/errors.py's run_main)."""


class UserError(Exception):
    """Bad input or params. Stage scripts print the message alone (no traceback) and exit 2."""
