"""User-facing errors: one line that names the file or key and says what to do."""
import atexit
import errno
import os
import re
import signal
import sys

from lib.config.errors import UserError

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
DENIED = (errno.EACCES, errno.EPERM, errno.EROFS)
# Credentials that may reach a message inside a URI (MLflow's errors quote the tracking URI whole)
URL_PASSWORD = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)[^@\s]+@")  # scheme://user:PASSWORD@
SECRET_QUERY_VALUE = re.compile(r"([?&][^=&\s]*(?:password|passwd|pwd|token|secret|key|signature|sig)[^=&\s]*=)"
                                r"[^&\s'\"]+", re.IGNORECASE)  # ?access_token=VALUE&...
SECRET_ENV = ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD")
INTERRUPTED_EXIT = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C
# outputs and checkpoints are written to temporary siblings and renamed: none is half-written
INTERRUPTED = "interrupted; run the stage again (dvc repro) to resume from its last checkpoint"


def run_main(main) -> None:
    """Call a stage's main(); turn a UserError, a full disk or a denied permission into a one-line
    message and exit code 2, and Ctrl-C into one line and exit code 130. Once Ctrl-C was pressed the
    stage ends that way whatever main() did next: a KeyboardInterrupt that some library swallowed (one
    raised in the middle of its import, say) must not let it train on, write outputs and exit 0. A Ctrl-C
    once main() has returned finds the stage's work complete and in place: it is ignored, the stage exits 0
    and DVC records it (Python would otherwise die by SIGINT while it shuts down, with no line, and DVC
    would run the complete stage again)."""
    stage_process = signal.getsignal(signal.SIGINT) is _exit_interrupted  # set by end_on_ctrl_c
    try:
        if stage_process:  # main() and the libraries see Ctrl-C as usual
            signal.signal(signal.SIGINT, _interrupt)
        main()
        stop_if_interrupted()
        if stage_process:  # an ignored signal stays ignored through the interpreter's shutdown
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    except BaseException as err:
        if _interrupted or isinstance(err, KeyboardInterrupt):
            _end_interrupted()
        if isinstance(err, UserError):
            print(f"error: {redact(str(err))}", file=sys.stderr)
            sys.exit(2)
        message = os_error_line(err) if isinstance(err, OSError) else None
        if message is None:
            raise
        print(f"error: {redact(message)}", file=sys.stderr)
        sys.exit(2)


def end_on_ctrl_c() -> None:
    """Make Ctrl-C end this process at once, with run_main's line and exit code, from now until run_main
    starts main(): a stage's imports (torch and the like, 1-4 s) would otherwise end in a traceback of
    whatever module was loading, or, where that module's import-time code catches the exception, go on
    with a half-imported library. Nothing is written before main(), so nothing is left half-done. Where
    Ctrl-C is ignored (a process started in the background), it stays ignored."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _exit_interrupted)


def stop_if_interrupted() -> None:
    """Raise KeyboardInterrupt again if Ctrl-C was pressed, in case its first one was swallowed: called
    before an output is put in place, at every progress update and where an error would be passed over."""
    if _interrupted:
        raise KeyboardInterrupt


_interrupted = False  # set by the first Ctrl-C that run_main's handler sees


def _interrupt(*signal_args) -> None:
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt


def _exit_interrupted(*signal_args) -> None:
    print(INTERRUPTED, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(INTERRUPTED_EXIT)  # no exception: none can be caught by the import it interrupts


def _end_interrupted() -> None:
    """Exit 130 after the exit handlers, not through SystemExit: a KeyboardInterrupt that passed through a
    C extension's embedded Python (MLflow's imports have them) marks the interpreter, which then ends itself
    by SIGINT at exit whatever code sys.exit gave, and DVC would report a kill instead of Ctrl-C's line."""
    print(INTERRUPTED, file=sys.stderr, flush=True)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    os._exit(INTERRUPTED_EXIT)


def os_error_line(err: OSError) -> str | None:
    """What to tell the user about an OSError they can fix (a full disk, a denied permission); None
    for any other, which is a bug to see with its traceback."""
    if err.errno in DISK_FULL:
        # every output and checkpoint is written to a temporary sibling and renamed: the old ones stand
        where = f" writing {err.filename}" if err.filename else ""
        return (f"no space left on the device{where}; free some and run the stage again "
                "(earlier outputs and checkpoints are intact)")
    if err.errno in DENIED:
        return (f"{err.filename or 'a file or folder'}: {err.strerror.lower()}; fix its permissions or point the "
                "stage elsewhere")
    return None


def describe(err: BaseException) -> str:
    """'TypeName: first line of the message', for one-line reports of errors from libraries, with
    credentials redacted."""
    lines = redact(str(err)).strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:200]}" if lines else type(err).__name__


def redact(text: str) -> str:
    """`text` with credentials masked as ***: a URL's password (scheme://user:***@host), the values of
    secret-looking query parameters (?token=***), and the values of MLflow's credential variables."""
    text = URL_PASSWORD.sub(r"\1***@", text)
    text = SECRET_QUERY_VALUE.sub(r"\1***", text)
    for name in SECRET_ENV:
        if os.environ.get(name):
            text = text.replace(os.environ[name], "***")
    return text


def one_line(err: BaseException) -> str:
    """torch's state-dict errors span lines and start with a generic header; keep them on one line."""
    return f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
