"""Faults outside the code: a disk that fills up while a checkpoint or an output is written, an output
folder that cannot be written, Ctrl-C."""
import contextlib
import errno
import importlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml

from lib.core import errors
from lib.core.distributed import full_state
from lib.core.errors import INTERRUPTED, end_on_ctrl_c, run_main
from lib.core.io import atomic_dir, write_json
from lib.training import checkpoint
from lib.training.checkpoint import load_checkpoint, save_checkpoint
from tests.helpers import ROOT, read_only_folder
from tests.test_pipeline import copy_reproduced, without_timings


def disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device", str(args[-1]) if args else None)


def state(module):
    optimizer = torch.optim.AdamW(module.parameters(), lr=0.1)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def test_disk_full_while_checkpointing_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    module = torch.nn.Linear(3, 3)
    optimizer, scheduler = state(module)
    save_checkpoint(tmp_path, *full_state(module, optimizer), scheduler, {"fingerprint": "a", "step": 5})
    saved = {k: v.clone() for k, v in module.state_dict().items()}
    with torch.no_grad():
        module.weight.add_(1.0)
    monkeypatch.setattr(checkpoint.torch, "save", disk_full)  # the weights are written, then the disk is full
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(tmp_path, *full_state(module, optimizer), scheduler, {"fingerprint": "a", "step": 10})
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-000001"]  # no half-written checkpoint beside it
    restored = torch.nn.Linear(3, 3)
    assert load_checkpoint(tmp_path, restored, *state(restored), "a")["step"] == 5
    assert all(torch.equal(restored.state_dict()[k], v) for k, v in saved.items())


def test_disk_full_while_writing_an_output_keeps_the_old_one(tmp_path, monkeypatch):
    out = tmp_path / "model"
    with atomic_dir(out) as tmp:
        write_json(tmp / "config.json", {"version": 1})
    with pytest.raises(OSError):
        with atomic_dir(out) as tmp:
            (tmp / "weights.bin").write_bytes(b"x" * 100)
            disk_full(tmp / "config.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    assert (out / "config.json").read_text().count('"version": 1') == 1 and not (out / "weights.bin").exists()


# sitecustomize of a stage process whose disk fills up: the FULL_DISK_AT-th file it opens for writing whose path
# matches the glob FULL_DISK_FILES takes half of its first write, then ENOSPC (a write's error names no file)
FILLING_DISK = """
import builtins, errno, fnmatch, io, os

_open, _opened = builtins.open, 0


class Filling:
    def __init__(self, file):
        self._file = file

    def write(self, data):
        self._file.write(data[:len(data) // 2])
        self._file.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return self._file.__exit__(*exc_info)


def filling_open(file, mode="r", *args, **kwargs):
    global _opened
    opened = _open(file, mode, *args, **kwargs)
    writing = set(mode) & set("wax") and isinstance(file, (str, os.PathLike))
    if writing and fnmatch.fnmatch(os.fspath(file), os.environ["FULL_DISK_FILES"]):
        _opened += 1
        if _opened == int(os.environ["FULL_DISK_AT"]):
            return Filling(opened)
    return opened


builtins.open = io.open = filling_open
"""
DISK_FULL_LINE = ("error: no space left on the device{}; free some and run the stage again (earlier outputs and "
                  "checkpoints are intact)")


def stage_command(repo: Path, stage: str) -> list[str]:
    """The stage's command in dvc.yaml, run by this Python."""
    return [sys.executable, *yaml.safe_load((repo / "dvc.yaml").read_text())["stages"][stage]["cmd"].split()[1:]]


def on_a_filling_disk(repo: Path, stage: str, files: str, at: int, tmp_path: Path) -> subprocess.CompletedProcess:
    """`stage` run in `repo` as DVC runs it, on a disk that fills up in the middle of the `at`-th file it writes whose
    path matches the glob `files`; its temporary folder is tmp_path/tmp."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(FILLING_DISK)
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "TMPDIR": str(tmp_path / "tmp"),
           "FULL_DISK_FILES": files, "FULL_DISK_AT": str(at)}
    return subprocess.run(stage_command(repo, stage), cwd=repo, env=env, capture_output=True, text=True, timeout=600)


def test_a_disk_that_fills_while_pretrain_checkpoints_keeps_the_last_checkpoint_to_resume_from(reproduced, tmp_path):
    """The second checkpoint's state.json, written after its weights and optimizer state: the stage ends in one line,
    the first checkpoint stands alone and whole, and the stage run again resumes from it to the same result."""
    repo = copy_reproduced(reproduced, tmp_path / "project")
    model, metrics = (repo / "models/pretrain/model.safetensors").read_bytes(), repo / "metrics/pretrain.json"
    before = without_timings(json.loads(metrics.read_text()))
    done = on_a_filling_disk(repo, "pretrain", "*/.ckpt-*/.state.json.tmp-*", 2, tmp_path)
    assert done.returncode == 2 and done.stderr.splitlines() == [DISK_FULL_LINE.format("")]
    saved = repo / "data/checkpoints/pretrain"
    assert [p.name for p in saved.iterdir()] == ["ckpt-000001"] and checkpoint.verify(saved / "ckpt-000001") is None
    assert (repo / "models/pretrain/model.safetensors").read_bytes() == model
    resumed = subprocess.run(stage_command(repo, "pretrain"), cwd=repo, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from step 10" in resumed.stdout
    assert without_timings(json.loads(metrics.read_text())) == before


@pytest.mark.parametrize("writing", [1, 2], ids=["the-exported-graph", "its-int8-copy"])
def test_a_disk_that_fills_while_evaluate_writes_onnx_leaves_no_onnx_and_the_last_outputs(reproduced, tmp_path,
                                                                                         writing):
    """evaluate writes ONNX files only to quantize the student: the exported graph, then ONNX Runtime's int8 copy,
    in a temporary folder. A disk that fills up in either ends the stage in one line that names the folder (its
    disk is often not the project's), and leaves no ONNX file, temporary or not, and the last report as it was."""
    repo = copy_reproduced(reproduced, tmp_path / "project")
    outputs = {path: path.read_bytes() for name in ("metrics", "plots", "reports") for path in (repo / name).rglob("*")
               if path.is_file()}
    done = on_a_filling_disk(repo, "evaluate", "*.onnx", writing, tmp_path)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr[-3000:]
    head, tail = DISK_FULL_LINE.split("{}")
    assert done.stderr.startswith(f"{head} writing {tmp_path / 'tmp'}/quantize-") and done.stderr.endswith(f"{tail}\n")
    assert not [path for folder in (repo, tmp_path / "tmp") for pattern in ("*.onnx", "*.onnx.*", "quantize-*")
                for path in folder.rglob(pattern)]
    assert {path: path.read_bytes() for name in ("metrics", "plots", "reports") for path in (repo / name).rglob("*")
            if path.is_file()} == outputs


STAGE_OUTPUTS = {"data": ("--out", "--metrics"), "clean": ("--out", "--metrics", "--plots"),
                 "tokenizer": ("--out", "--metrics", "--plots"),
                 **{stage: ("--out", "--metrics", "--plots", "--checkpoints")
                    for stage in ("pretrain", "adapt", "finetune", "distill")},
                 "evaluate": ("--metrics", "--plots", "--report")}


@pytest.mark.parametrize("stage", STAGE_OUTPUTS)
def test_a_stage_stops_at_start_on_an_output_it_cannot_write(stage, tmp_path, monkeypatch, capsys):
    """Each output of each stage is checked before any work: the stage runs here with no params file
    and no inputs, so only a check made first can give this line."""
    monkeypatch.chdir(tmp_path)  # the other outputs' default paths resolve here
    main = importlib.import_module(f"stages.{stage}").main
    with read_only_folder(tmp_path / "locked", monkeypatch) as locked:
        for option in STAGE_OUTPUTS[stage]:
            target = locked / option.strip("-")
            monkeypatch.setattr(sys, "argv", [stage, option, str(target)])
            with pytest.raises(SystemExit) as done:
                run_main(main)
            assert done.value.code == 2
            assert capsys.readouterr().err.splitlines() == [
                f"error: cannot write {target}: permission denied on {locked}; fix its permissions or point the "
                "stage elsewhere"]


def run_main_raising(error: str) -> subprocess.CompletedProcess:
    """A stage process whose main() raises `error` (Python source) through lib.core.errors.run_main."""
    code = f"import errno; from lib.core.errors import run_main\ndef main(): raise {error}\nrun_main(main)"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_a_full_disk_ends_a_stage_in_one_line():
    done = run_main_raising("OSError(errno.ENOSPC, 'No space left on device', "
                            "'models/pretrain/.tmp/model.safetensors')")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: no space left on the device writing models/pretrain/.tmp/model.safetensors; free some and run the "
        "stage again (earlier outputs and checkpoints are intact)"]


def test_ctrl_c_ends_a_stage_in_one_line_with_the_shells_exit_code():
    done = run_main_raising("KeyboardInterrupt")
    assert done.returncode == 130
    assert done.stderr.strip().splitlines() == [INTERRUPTED]


def ctrl_c_reaches_it() -> None:
    """A child's SIGINT as a terminal's foreground job has it: a suite started as a background job (`cmd &`)
    has it ignored, and a stage keeps ignoring it there, as it should (the test below)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("stage", STAGE_OUTPUTS)
def test_ctrl_c_while_a_stage_imports_torch_ends_it_in_one_line(stage, tmp_path):
    """Ctrl-C in a stage's first seconds, before its main() runs: torch alone takes 1-3 s to import."""
    outputs = [arg for option in STAGE_OUTPUTS[stage] for arg in (option, str(tmp_path / option.strip("-")))]
    proc = subprocess.Popen([sys.executable, "-m", f"stages.{stage}", "--params", str(tmp_path / "params.yaml"),
                             *outputs], cwd=ROOT, stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_reaches_it)
    maps = Path(f"/proc/{proc.pid}/maps")
    while proc.poll() is None and "libtorch" not in maps.read_text():  # torch loads its libraries first
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert stderr.splitlines() == [INTERRUPTED]


def started_adapt(repo: Path) -> tuple[subprocess.Popen, float]:
    """`dvc repro -f -s adapt` in its own process group, once DVC has said it runs the stage, and when.
    DVC runs a stage's cmd through $SHELL, else /bin/sh: bash runs a lone command as its own process, so
    DVC reports the stage's exit code, while dash stays beside it and ends itself by the SIGINT, which DVC
    reports as -2 whatever the stage did. The stage is what this checks, so the shell is bash."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1",
           "PYTHONUNBUFFERED": "1", "SHELL": shutil.which("bash")}
    proc = subprocess.Popen(["dvc", "repro", "-f", "-s", "adapt"], cwd=repo, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, preexec_fn=ctrl_c_reaches_it)
    for line in proc.stdout:
        if line.startswith("Running stage 'adapt'"):
            return proc, time.monotonic()
    raise AssertionError(f"dvc repro never ran adapt (exit {proc.wait()})")


RUNTIME_LINE = "runtime: "  # a stage's first line, once its imports are done and its params read


def adapt_outputs(repo: Path) -> dict[str, bytes]:
    files = [repo / "dvc.lock", repo / "metrics" / "adapt.json", *sorted((repo / "models" / "adapt").rglob("*"))]
    return {str(file.relative_to(repo)): file.read_bytes() for file in files if file.is_file()}


def ctrl_c_at(proc: subprocess.Popen, marker: str, seconds: float) -> str:
    """Send Ctrl-C to `proc`'s process group `seconds` from now or as soon as it prints a line starting with
    `marker`, whichever comes first; its log once it ended."""
    lines, seen = [], threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(marker):
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + seconds
    while not seen.wait(0.01) and reader.is_alive() and time.monotonic() < deadline:
        pass
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=120)
    reader.join(timeout=60)
    return "".join(lines)


def test_ctrl_c_anywhere_in_a_stage_s_start_ends_it_and_writes_nothing(reproduced, tmp_path):
    """Ctrl-C (SIGINT to DVC's process group, as a terminal sends it) at points spread over adapt's start-up
    and first steps, through `dvc repro`: each time the stage ends with the one line and exit 130, and
    neither its outputs nor dvc.lock change. The start-up points are shares of this machine's own time to
    the stage's first line, each sent at the latest when that line comes, since a loaded machine runs the
    same stage at very different speeds; the later ones are sent on the lines that open the tracked run
    and report the first steps. A Ctrl-C that an import swallowed once let the stage train on, write its
    outputs and DVC its lock."""
    repo = copy_reproduced(reproduced, tmp_path)
    proc, started = started_adapt(repo)
    first_line = next(line for line in proc.stdout if line.startswith(RUNTIME_LINE))
    start_up = time.monotonic() - started
    assert proc.wait(timeout=300) == 0, first_line + proc.stdout.read()
    before = adapt_outputs(repo)
    points = [(RUNTIME_LINE, share * start_up) for share in (0.05, 0.2, 0.35, 0.5, 0.65, 0.8, 0.95)]
    for marker, seconds in points + [("before adapt:", math.inf), ("adapt: ", math.inf)]:
        where = f"at {seconds:.2f} s or on {marker!r}"
        log = ctrl_c_at(started_adapt(repo)[0], marker, seconds)
        assert INTERRUPTED in log.splitlines() and "Traceback" not in log, f"{where}: {log}"
        assert "exited with 130" in log, f"{where}: {log}"
        assert adapt_outputs(repo) == before, f"{where}, outputs changed: {log}"


SWALLOWING = {  # where the Ctrl-C lands: code that catches it and goes on, as some libraries' imports do
    "an import": "import swallowing_import",
    "main(), in Python": "try:\n        wait()\n    except BaseException:\n        pass",
    # C code running Python (PyRun_SimpleString) prints and clears the KeyboardInterrupt, and marks the
    # interpreter to end itself by SIGINT at exit whatever code it exits with
    "main(), in C": "ctypes.pythonapi.PyRun_SimpleString(b'from __main__ import wait; wait()')",
}
SWALLOWED_CTRL_C = """
import ctypes, os, sys, time
from lib.core.errors import end_on_ctrl_c, run_main
from lib.core.io import write_json

def wait():
    print("ready", flush=True)
    time.sleep(60)

def main():
    {where}
    write_json(sys.argv[1], {{"done": True}})

end_on_ctrl_c()
{imports}
run_main(main)
"""


@pytest.mark.parametrize("where", SWALLOWING)
def test_a_ctrl_c_that_code_swallows_still_ends_the_stage_and_writes_nothing(where, tmp_path):
    (tmp_path / "swallowing_import.py").write_text(
        "from __main__ import wait\ntry:\n    wait()\nexcept BaseException:\n    pass\n")
    in_import = where == "an import"
    code = SWALLOWED_CTRL_C.format(where="pass" if in_import else SWALLOWING[where],
                                   imports=SWALLOWING[where] if in_import else "")
    out = tmp_path / "out.json"
    proc = subprocess.Popen([sys.executable, "-c", code, str(out)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_reaches_it,
                            env={**os.environ, "PYTHONPATH": f"{ROOT}:{tmp_path}"})
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert stderr.splitlines()[-1] == INTERRUPTED
    assert not out.exists()


DONE_THEN_SLOW_EXIT = """
import atexit, sys, time
from lib.core.errors import end_on_ctrl_c, run_main
from lib.core.io import write_json

def slow_exit():  # what MLflow's and torch's exit handlers and Python's shutdown take on a loaded machine
    print("exiting", flush=True)
    time.sleep(1)

end_on_ctrl_c()
atexit.register(slow_exit)
run_main(lambda: write_json(sys.argv[1], {"done": True}))
"""


def test_a_ctrl_c_once_the_stage_s_work_is_done_lets_it_end_as_done(tmp_path):
    """Its outputs are complete and in place: exit 0 with no traceback lets DVC record them, where a
    death by SIGINT during the interpreter's shutdown would make DVC run the whole stage again."""
    out = tmp_path / "out.json"
    proc = subprocess.Popen([sys.executable, "-c", DONE_THEN_SLOW_EXIT, str(out)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_reaches_it)
    assert proc.stdout.readline() == "exiting\n"
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert (proc.returncode, stderr) == (0, "")
    assert json.loads(out.read_text()) == {"done": True}


def test_ctrl_c_is_keyboard_interrupt_again_in_main_and_stays_ignored_where_it_was(monkeypatch):
    """A pool of clean's workers relies on KeyboardInterrupt; a stage started in the background ignores Ctrl-C."""
    monkeypatch.setattr(errors, "_interrupted", False)  # restored after the handler below is tried
    before = signal.getsignal(signal.SIGINT)
    seen = []
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        end_on_ctrl_c()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.signal(signal.SIGINT, signal.default_int_handler)
        end_on_ctrl_c()
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
        run_main(lambda: seen.append(signal.getsignal(signal.SIGINT)))
    finally:
        signal.signal(signal.SIGINT, before)
    with pytest.raises(KeyboardInterrupt):
        seen[0](signal.SIGINT, None)


CLEANING_FOREVER = """
import itertools
from lib.config.params import CleanConfig
from lib.core.errors import run_main
from lib.data.clean import CleanStats, DocumentCleaner

def main():
    docs = (f"Document {i} " + "with plenty of ordinary words in it " * 20 for i in itertools.count())
    for n, _ in enumerate(DocumentCleaner(CleanConfig(workers=2)).run(docs, CleanStats())):
        if n == 0:
            print("cleaning", flush=True)

run_main(main)
"""


def test_ctrl_c_while_clean_s_worker_pool_runs_ends_it_in_one_line():
    """A terminal's Ctrl-C reaches the whole process group: the pool's workers as well as the stage."""
    proc = subprocess.Popen([sys.executable, "-c", CLEANING_FOREVER], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=ctrl_c_reaches_it)
    try:
        assert proc.stdout.readline() == "cleaning\n"
        os.killpg(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # a hung pool: its workers too
    assert proc.returncode == 130
    assert stderr.strip().splitlines() == [INTERRUPTED]


def test_a_denied_permission_met_later_ends_a_stage_in_one_line_naming_the_file():
    done = run_main_raising("PermissionError(errno.EACCES, 'Permission denied', 'models/finetune/imdb/head.safetensors')")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: models/finetune/imdb/head.safetensors: permission denied; fix its permissions or point the stage "
        "elsewhere"]
