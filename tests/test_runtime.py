"""lib/core/runtime.py: the bf16 probe (with fake children, and once for real), the precision it decides,
its cache, and torch's CPU threads."""
from __future__ import annotations

import hashlib
import json
import os
import threading
from types import SimpleNamespace

import pytest
import torch

from lib.config.errors import UserError
from lib.config.params import ImplConfig
from lib.core import runtime

CPU, CUDA = torch.device("cpu"), torch.device("cuda")  # CUDA is only compared against: nothing runs on it
# Fake probe children: each one counts its runs in the file $PROBE_CALLS, then behaves as a CPU would.
COUNT = "import os, time\nopen(os.environ['PROBE_CALLS'], 'a').write('x')\n"
CRASH = COUNT + "import signal\nos.kill(os.getpid(), signal.SIGILL)\n"
SLOWER = COUNT + "print('{\"fp32_gflops\": 239.0, \"bf16_gflops\": 163.0}')\n"
FASTER = COUNT + "print('{\"fp32_gflops\": 240.0, \"bf16_gflops\": 480.0}')\n"
FAILS = COUNT + "raise RuntimeError('no bf16 kernel')\n"
GARBLED = COUNT + "print('bf16: fine')\n"


@pytest.fixture
def fake_child(tmp_path, monkeypatch):
    """Make the probe run `code` instead of the real measurement; returns the number of runs so far."""
    calls = tmp_path / "calls"
    calls.touch()
    monkeypatch.setenv("PROBE_CALLS", str(calls))
    monkeypatch.setenv(runtime.CACHE_ENV, str(tmp_path / "cache"))
    for name in runtime.ISA_ENV:
        monkeypatch.delenv(name, raising=False)

    def use(code: str):
        monkeypatch.setattr(runtime, "PROBE_CODE", code)
        return lambda: len(calls.read_text())
    return use


@pytest.mark.parametrize("code, outcome, auto", [(CRASH, "crash", "fp32"), (SLOWER, "slower", "fp32"),
                                                 (FASTER, "faster", "bf16"), (FAILS, "crash", "fp32"),
                                                 (GARBLED, "crash", "fp32")])
def test_auto_runs_bf16_on_cpu_only_where_the_probe_found_it_faster(fake_child, code, outcome, auto):
    fake_child(code)
    probe = runtime.cpu_bf16_probe()
    assert probe.outcome == outcome
    if code is CRASH:
        assert probe.failure == "SIGILL" and probe.fp32_gflops is None
    if code is FAILS:
        assert probe.failure == "exit code 1: RuntimeError: no bf16 kernel"
    if code is GARBLED:
        assert probe.failure == "unreadable output: 'bf16: fine'"
    if code is SLOWER:
        assert (probe.bf16_gflops, probe.fp32_gflops) == (163.0, 239.0)
    assert runtime.resolve_precision("auto", CPU) == auto
    assert runtime.resolve_precision("fp32", CPU) == "fp32"


def test_explicit_bf16_runs_where_slower_and_fails_in_one_line_where_it_crashes(fake_child, tmp_path, monkeypatch):
    fake_child(SLOWER)
    assert runtime.resolve_precision("bf16", CPU) == "bf16"  # asked for: slower is the user's call
    fake_child(CRASH)
    monkeypatch.setenv(runtime.CACHE_ENV, str(tmp_path / "another-machine"))
    with pytest.raises(UserError) as info:
        runtime.resolve_precision("bf16", CPU)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("impl.precision: bf16 crashes on this CPU (a bf16 matmul died with SIGILL")
    assert "set impl.precision: auto or fp32, or export ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16" in message
    with pytest.raises(UserError, match="^precision: 'bf32' is not one of auto, bf16, fp32$"):
        runtime.resolve_precision("bf32", CPU, key="precision")


def test_cuda_keeps_bf16_and_fp32_never_probes(fake_child):
    calls = fake_child(CRASH)
    assert [runtime.resolve_precision(p, CUDA) for p in ("auto", "bf16", "fp32")] == ["bf16", "bf16", "fp32"]
    assert runtime.resolve_precision("fp32", CPU) == "fp32"
    assert calls() == 0


def test_the_probe_is_cached_per_onednn_isa_and_thread_count(fake_child, monkeypatch):
    calls = fake_child(FASTER)
    first = runtime.cpu_bf16_probe(threads=2)
    assert runtime.cpu_bf16_probe(threads=2) == first and calls() == 1
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    assert runtime.probe_cache_file(2) != runtime.probe_cache_file(1)
    isa_limited = runtime.probe_cache_file(2)
    runtime.cpu_bf16_probe(threads=2)
    assert calls() == 2 and isa_limited.is_file()
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    assert runtime.probe_cache_file(2) != isa_limited
    runtime.cpu_bf16_probe(threads=2)
    assert calls() == 2  # the first result, still cached
    assert not list(isa_limited.parent.glob("*.tmp"))  # written to a temporary file, then renamed


def test_a_corrupt_cache_file_is_ignored_and_rewritten(fake_child):
    calls = fake_child(SLOWER)
    path = runtime.probe_cache_file(torch.get_num_threads())
    path.parent.mkdir(parents=True)
    for corrupt in ('{"outcome": "slow', '{"outcome": "maybe", "fp32_gflops": 1, "bf16_gflops": 1, '
                    '"failure": null, "seconds": 1}', "[]"):
        path.write_text(corrupt)
        assert runtime.resolve_precision("auto", CPU) == "fp32"
        assert json.loads(path.read_text())["outcome"] == "slower"
    assert calls() == 3


def test_processes_starting_together_probe_once(fake_child):
    """torchrun's ranks: the first probes, the others wait on the lock and read its result."""
    calls = fake_child(COUNT + "time.sleep(0.5)\n" + SLOWER.removeprefix(COUNT))
    results = []
    workers = [threading.Thread(target=lambda: results.append(runtime.cpu_bf16_probe(threads=1))) for _ in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert calls() == 1 and len(results) == 3 and all(r.outcome == "slower" for r in results)


def test_the_real_probe_answers_without_crashing_this_process(tmp_path, monkeypatch):
    monkeypatch.setenv(runtime.CACHE_ENV, str(tmp_path))
    probe = runtime.cpu_bf16_probe()
    assert probe.outcome in runtime.OUTCOMES
    if probe.outcome != "crash":
        assert probe.fp32_gflops > 0 and probe.bf16_gflops > 0
    print(f"bf16 probe on this machine: {probe}")


def test_autocast_takes_a_resolved_precision():
    assert isinstance(runtime.autocast(CPU, "fp32"), type(runtime.autocast(CUDA, "fp32")))
    with pytest.raises(ValueError, match="resolved precision"):
        runtime.autocast(CPU, "auto")


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """An 8-core affinity, no cgroup quota, no OMP_NUM_THREADS, not a queued experiment."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(runtime, "CGROUP_ROOT", tmp_path / "cgroup")
    (tmp_path / "cgroup" / "cpu").mkdir(parents=True)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    return tmp_path / "cgroup"


def test_threads_follow_the_request_then_omp_then_the_usable_cores(machine, monkeypatch):
    assert runtime.cpu_threads(0) == 8
    assert runtime.cpu_threads(3) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert runtime.cpu_threads(0) == 2 and runtime.cpu_threads(5) == 5


def test_a_number_asked_above_the_usable_cores_is_capped_at_them(machine, monkeypatch, capsys):
    """1000 threads on 2 cores ran pretrain 3 times slower and a finetune run 44 times."""
    assert runtime.cpu_threads(1000) == 8
    monkeypatch.setenv("OMP_NUM_THREADS", "64")
    assert runtime.cpu_threads(0) == 8
    monkeypatch.delenv("OMP_NUM_THREADS")
    before = torch.get_num_threads()
    try:
        assert runtime.configure(ImplConfig(precision="fp32", threads=1000), CPU)["threads"] == 8
    finally:
        torch.set_num_threads(before)
    printed = capsys.readouterr()
    assert printed.err == ("warning: impl.threads is 1000, more than the 8 cores this process may use; running 8 "
                           "threads (more would wait on each other)\n")
    assert printed.out == "runtime: cpu, 8 threads (impl.threads capped at the 8 usable cores), precision fp32 (as set)\n"


@pytest.mark.parametrize("files, threads", [
    ({"cpu.max": "150000 100000\n"}, 2),  # v2: 1.5 CPUs, rounded up
    ({"cpu.max": "max 100000\n"}, 8),
    ({"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1),  # v1
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, 8),
    ({"cpu.max": "garbage\n"}, 8),
])
def test_a_cgroup_quota_caps_the_threads(machine, files, threads):
    for name, text in files.items():
        (machine / name).write_text(text)
    assert runtime.cpu_threads(0) == threads


@pytest.mark.parametrize("workers, threads", [(1, 8), (2, 4), (3, 2), (16, 1)])
def test_queue_workers_share_the_cores(machine, monkeypatch, workers, threads):
    monkeypatch.setattr(runtime, "queue_workers", lambda: workers)
    assert runtime.cpu_threads(0) == threads
    assert runtime.cpu_threads(6) == 6


def test_queue_workers_counts_this_projects_workers_from_inside_a_queued_experiment(tmp_path, monkeypatch):
    import psutil

    root = tmp_path / "project"
    experiment = root / ".dvc" / "tmp" / "exps" / "tmp1234"
    experiment.mkdir(parents=True)
    ours = hashlib.sha256(str(root / ".dvc" / "tmp" / "exps" / "celery").encode()).hexdigest()[:6]
    cmdlines = [["python", "dvc", "exp", "queue-worker", f"dvc-exp-{ours}-1@localhost", "--clean"],
                ["python", "dvc", "exp", "queue-worker", f"dvc-exp-{ours}-2@localhost"],
                ["python", "dvc", "exp", "queue-worker", "dvc-exp-abcdef-1@localhost"],  # another project's
                None,  # a process whose command line may not be read
                ["python", "-m", "stages.finetune"]]
    monkeypatch.setattr(psutil, "process_iter", lambda attrs: [SimpleNamespace(info={"cmdline": c}) for c in cmdlines])
    monkeypatch.setenv("DVC_ROOT", str(root))
    monkeypatch.chdir(root)
    assert runtime.queue_workers() == 1  # in the workspace: a plain `dvc repro`, or a -j 1 run
    monkeypatch.chdir(experiment)
    assert runtime.queue_workers() == 2
    monkeypatch.delenv("DVC_ROOT")
    assert runtime.queue_workers() == 1


def test_configure_sets_the_threads_and_says_what_it_chose(fake_child, machine, monkeypatch, capsys):
    fake_child(SLOWER)
    before = torch.get_num_threads()
    try:
        facts = runtime.configure(ImplConfig(threads=1), CPU)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert facts == {"device": "cpu", "threads": 1, "precision_asked": "auto", "bf16_probe": "slower",
                     "bf16_probe_gflops": 163.0, "fp32_probe_gflops": 239.0, "precision": "fp32"}
    line = capsys.readouterr().out
    assert line.startswith("runtime: cpu, 1 thread (impl.threads), precision fp32 (auto: bf16 probe on this CPU: "
                           "slower, 163 vs 239 GFLOP/s; cached in ")
    assert line.count("\n") == 1
    monkeypatch.setenv("RANK", "1")  # under torchrun, rank 0 alone says it
    try:
        assert runtime.configure(ImplConfig(precision="fp32", threads=before), CPU)["precision"] == "fp32"
    finally:
        torch.set_num_threads(before)
    assert capsys.readouterr().out == ""
