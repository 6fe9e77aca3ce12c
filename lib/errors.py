"""User-facing errors: one line that names the file or key and says what to do."""
import errno
import sys

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class UserError(Exception):
    """Bad input or params. Stage scripts print the message alone (no traceback) and exit 2."""


def run_main(main) -> None:
    """Call a stage's main(); turn a UserError or a full disk into a one-line message and exit code 2."""
    try:
        main()
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except OSError as err:
        if err.errno not in DISK_FULL:
            raise
        # every output and checkpoint is written to a temporary sibling and renamed: the old ones stand
        where = f" writing {err.filename}" if err.filename else ""
        print(f"error: no space left on the device{where}; free some and run the stage again "
              "(earlier outputs and checkpoints are intact)", file=sys.stderr)
        sys.exit(2)


def describe(err: BaseException) -> str:
    """'TypeName: first line of the message', for one-line reports of errors from libraries."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:200]}" if lines else type(err).__name__
