"""Faults outside the code: a disk that fills up while a checkpoint or an output is written, an output
folder that cannot be written, Ctrl-C."""
import contextlib
import errno
import importlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lib.core.errors import INTERRUPTED, end_on_ctrl_c, run_main
from lib.core.io import atomic_dir, write_json
from lib.training import checkpoint
from lib.training.checkpoint import load_checkpoint, save_checkpoint
from lib.training.distributed import full_state
from tests.helpers import ROOT, read_only_folder


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


def test_ctrl_c_is_keyboard_interrupt_again_in_main_and_stays_ignored_where_it_was():
    """A pool of clean's workers relies on KeyboardInterrupt; a stage started in the background ignores Ctrl-C."""
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
    assert seen == [signal.default_int_handler]


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
