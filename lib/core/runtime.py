"""How to run on this machine: torch's CPU threads and the precision every autocast uses.

Threads. torch starts one thread per core it sees, whatever else holds those cores: on a 2-core
machine where another job held one, a finetune run took 446 s with 2 threads instead of 31 s
(OpenMP threads waiting on each other), 88-104 s with 1. So `impl.threads: 0` (auto) sizes torch to
the cores this process may use (its CPU affinity, capped by a cgroup CPU quota), shared out between
DVC's queue workers when the stage runs under `dvc exp run --run-all -j N` / `dvc queue start -j N`.
An OMP_NUM_THREADS the user set wins over auto. A number asked for (impl.threads, OMP_NUM_THREADS) above
the usable cores is capped at them, with a warning: 1000 threads on 2 cores cut pretrain from 679 to
218 tokens/s, and a finetune run took 44 s instead of 1.

Precision. bf16 autocast on CPU is not always a gain, nor always safe: where CPUID advertises AMX
and the VM does not enable it, oneDNN sends bf16 matmuls to AMX kernels and the interpreter dies of
SIGILL; where it runs, bf16 can be slower than fp32 (a 2048x2048 matmul at 163 vs 239 GFLOP/s on one
2-core Xeon), and about twice as fast where AMX works. `cpu_bf16_probe` finds out in a child process
(its crash is not ours) by timing one matmul both ways, once per machine, torch version, oneDNN ISA
limit and thread count, and caches the answer under the user's cache directory. `impl.precision:
auto` then means bf16 on CUDA, and on CPU only where the probe found bf16 clearly faster. Which
precision ran goes into each stage's metrics and MLflow params: on CPU it depends on the machine.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from lib.config.errors import UserError
from lib.config.params import ImplConfig

Precision = Literal["bf16", "fp32"]
PRECISIONS = ("auto", "bf16", "fp32")
OUTCOMES = ("crash", "slower", "faster")
FASTER_BY = 1.2  # bf16 must beat fp32 by this factor to count as faster: a near tie is not worth bf16's rounding
CACHE_ENV = "TRANSFER_PIPELINE_CACHE"  # a folder for the probe's results instead of ~/.cache/transfer-pipeline
ISA_ENV = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")  # oneDNN's instruction-set limit: it changes the answer
CPU_FIELDS = ("model name", "flags", "CPU implementer", "CPU part", "Features")  # /proc/cpuinfo, x86 and ARM
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROBE_TIMEOUT_S = 300  # the probe takes seconds; a child still running after this is stuck
# The child: fp32 and bf16-autocast matmuls of one size, alternating in rounds (a burst of load from
# another process then hits both), each kind's best round in GFLOP/s, printed as JSON. Its first bf16
# matmul is where oneDNN picks its kernels, and where a wrong pick kills it.
PROBE_CODE = """
import contextlib, json, sys, time
import torch
threads, size, seconds, rounds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
a, b = torch.randn(size, size), torch.randn(size, size)
kinds = {"fp32": contextlib.nullcontext, "bf16": lambda: torch.autocast("cpu", dtype=torch.bfloat16)}
best = dict.fromkeys(kinds, 0.0)
for context in kinds.values():
    with context():
        a @ b
for _ in range(rounds):
    for kind, context in kinds.items():
        with context():
            calls, start = 0, time.perf_counter()
            while calls == 0 or time.perf_counter() - start < seconds / rounds:
                a @ b
                calls += 1
            best[kind] = max(best[kind], 2 * size**3 * calls / (time.perf_counter() - start) / 1e9)
print(json.dumps({"fp32_gflops": best["fp32"], "bf16_gflops": best["bf16"]}))
"""
PROBE_SIZE, PROBE_SECONDS, PROBE_ROUNDS = 1024, 0.3, 3  # a 1024x1024 matmul, 0.3 s of each kind in 3 rounds


@dataclass(frozen=True)
class Probe:
    """What the child process found: bf16 autocast on this CPU crashes, is slower, or is faster."""
    outcome: str  # one of OUTCOMES
    fp32_gflops: float | None  # None after a crash
    bf16_gflops: float | None
    failure: str | None  # how the child died: a signal's name (SIGILL), or its exit code and last error line
    seconds: float  # the probe's wall time, child start to finish

    def describe(self) -> str:
        if self.outcome == "crash":
            return f"crash ({self.failure})"
        return f"{self.outcome}, {self.bf16_gflops:.0f} vs {self.fp32_gflops:.0f} GFLOP/s"


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("device: cuda, but no CUDA GPU is visible to torch; set device: auto or cpu")
    return torch.device("cuda" if name in ("auto", "cuda") and torch.cuda.is_available() else "cpu")


def resolve_precision(precision: str, device: torch.device, key: str = "impl.precision") -> Precision:
    """The precision to run: "bf16" (bf16 autocast) or "fp32". CUDA runs bf16 unless fp32 is asked
    for. On CPU, auto is bf16 only where the probe found it faster; an explicit bf16 runs as asked,
    slower or not, unless it crashes: then a UserError naming `key` says what to set."""
    if precision not in PRECISIONS:
        raise UserError(f"{key}: '{precision}' is not one of {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return "fp32"
    if device.type != "cpu":
        return "bf16"
    probe = cpu_bf16_probe()
    if precision == "auto":
        return "bf16" if probe.outcome == "faster" else "fp32"
    if probe.outcome == "crash":
        why = ": oneDNN picks instructions this machine does not run" if probe.failure == "SIGILL" else ""
        raise UserError(f"{key}: bf16 crashes on this CPU (a bf16 matmul died with {probe.failure} in a test "
                        f"process{why}); set {key}: auto or fp32, or export ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16")
    return "bf16"


def autocast(device: torch.device, precision: Precision) -> contextlib.AbstractContextManager:
    """The context every forward pass runs in, for a precision resolve_precision gave."""
    if precision not in ("bf16", "fp32"):
        raise ValueError(f"autocast takes a resolved precision (bf16 or fp32), not {precision!r}")
    return torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()


def cpu_bf16_probe(threads: int | None = None) -> Probe:
    """The probe's result for this machine at `threads` threads (default: torch's current number):
    read from the cache, or measured in a child process and cached. Processes that start at once
    (torchrun's ranks) wait for the first one's result instead of probing side by side."""
    threads = threads or torch.get_num_threads()
    path = probe_cache_file(threads)
    cached = _read_probe(path)
    if cached is not None:
        return cached
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.parent / "probe.lock", "w")
    except OSError as err:
        raise UserError(f"{path.parent}: cannot write the bf16 probe's cache ({err.strerror}); set {CACHE_ENV} "
                        "to a writable folder, or impl.precision: fp32") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cached = _read_probe(path)  # another process may have probed while this one waited
        if cached is not None:
            return cached
        probe = _run_probe(threads)
        _write_atomically(path, json.dumps(asdict(probe)))
    return probe


def probe_cache_file(threads: int) -> Path:
    """Where the probe's result for this CPU, torch, oneDNN ISA limit and thread count is kept."""
    key = {"cpu": _cpu_identity(), "torch": torch.__version__, "threads": threads,
           **{name: os.environ.get(name) for name in ISA_ENV}}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"bf16-probe-{digest}.json"


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "transfer-pipeline"


def _cpu_identity() -> str:
    """The CPU's model and instruction-set flags (of its first core): what oneDNN's choice of kernels
    depends on."""
    try:
        lines = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    first: dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(":")
        first.setdefault(name.strip(), value.strip())
    return " | ".join(first.get(name, "") for name in CPU_FIELDS)


def _run_probe(threads: int) -> Probe:
    args = [str(value) for value in (threads, PROBE_SIZE, PROBE_SECONDS, PROBE_ROUNDS)]
    started = time.perf_counter()
    try:  # the child inherits the environment: a user's ONEDNN_MAX_CPU_ISA applies to it
        child = subprocess.run([sys.executable, "-c", PROBE_CODE, *args], capture_output=True, text=True,
                               timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return Probe("crash", None, None, f"no answer in {PROBE_TIMEOUT_S} s", time.perf_counter() - started)
    seconds = time.perf_counter() - started
    if child.returncode < 0:
        return Probe("crash", None, None, _signal_name(-child.returncode), seconds)
    if child.returncode > 0:
        error = (child.stderr.strip().splitlines() or ["no message"])[-1][:200]
        return Probe("crash", None, None, f"exit code {child.returncode}: {error}", seconds)
    last_line = (child.stdout.strip().splitlines() or [""])[-1]
    try:
        rates = json.loads(last_line)
        fp32, bf16 = float(rates["fp32_gflops"]), float(rates["bf16_gflops"])
    except (ValueError, KeyError, TypeError):
        return Probe("crash", None, None, f"unreadable output: {last_line[:200]!r}", seconds)
    return Probe("faster" if bf16 >= FASTER_BY * fp32 else "slower", round(fp32, 1), round(bf16, 1), None,
                 seconds)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _read_probe(path: Path) -> Probe | None:
    """The cached probe, or None when there is none or it cannot be read (then it is probed again)."""
    try:
        probe = Probe(**json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None
    if probe.outcome not in OUTCOMES or (probe.outcome == "crash") != (probe.failure is not None):
        return None
    if probe.outcome != "crash" and not all(isinstance(rate, (int, float))
                                            for rate in (probe.fp32_gflops, probe.bf16_gflops)):
        return None
    return probe


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def cpu_threads(requested: int) -> int:
    """torch's CPU threads: `requested` when > 0; else (auto) OMP_NUM_THREADS if the user set it,
    else the cores this process may use, shared between the DVC queue workers running beside it. A
    number asked for is capped at the usable cores."""
    return _thread_choice(requested)[0]


def _thread_choice(requested: int) -> tuple[int, str, str | None]:
    """(threads, why, warning), for cpu_threads and configure's lines; the warning (else None) says
    that a number asked for was more than the usable cores."""
    omp = os.environ.get("OMP_NUM_THREADS", "")
    if requested > 0:
        asked, source = requested, "impl.threads"
    elif omp.isdigit() and int(omp) > 0:
        asked, source = int(omp), "OMP_NUM_THREADS"
    else:
        cores, workers = usable_cores(), queue_workers()
        shared = f", shared by {workers} queue workers" if workers > 1 else ""
        return max(1, cores // workers), f"{cores} usable cores{shared}", None
    cores = usable_cores()
    if asked <= cores:
        return asked, source, None
    return cores, f"{source} capped at the {cores} usable cores", (
        f"{source} is {asked}, more than the {cores} cores this process may use; running {cores} threads "
        "(more would wait on each other)")


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), at most its cgroup's CPU quota."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cgroup_cpu_quota(CGROUP_ROOT)
    return max(1, min(cores, quota) if quota else cores)


def cgroup_cpu_quota(cgroup: Path) -> int | None:
    """CPUs' worth of time the cgroup may use (cgroup v2 cpu.max, else v1 cpu.cfs_quota_us /
    cpu.cfs_period_us), rounded up; None without a quota. A container limited to 1.5 CPUs sees all
    the host's cores in its affinity but gets 2 threads' worth of time."""
    try:
        if (cgroup / "cpu.max").is_file():
            quota, period = (cgroup / "cpu.max").read_text().split()[:2]
        else:
            quota = (cgroup / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (cgroup / "cpu" / "cpu.cfs_period_us").read_text().strip()
        if quota == "max" or int(quota) <= 0:  # v1 says -1 for no quota
            return None
        return max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        return None


def queue_workers() -> int:
    """How many DVC queue workers of this project are running, when this process runs a queued
    experiment (its working directory is under <DVC_ROOT>/.dvc/tmp/exps/; DVC sets DVC_ROOT to the
    project, not to the experiment's temporary copy); else 1. Each of the N workers that `-j N`
    starts runs `dvc exp queue-worker dvc-exp-<hash>-<n>@localhost`, the hash being the first 6 hex
    digits of the sha256 of the project's queue folder."""
    root = os.environ.get("DVC_ROOT")
    if not root:
        return 1
    exps = os.path.join(root, ".dvc", "tmp", "exps")
    if not Path.cwd().resolve().is_relative_to(Path(exps).resolve()):
        return 1
    import psutil  # here: only queued experiments need it

    node = f"dvc-exp-{hashlib.sha256(os.path.join(exps, 'celery').encode()).hexdigest()[:6]}-"
    workers = 0
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []  # None where it may not be read
        workers += "queue-worker" in cmdline and any(arg.startswith(node) for arg in cmdline)
    return max(1, workers)


def configure(impl: ImplConfig, device: torch.device) -> dict[str, Any]:
    """Set torch's threads and resolve the precision, once at the start of a stage that runs a model;
    print one line saying what was chosen and why (rank 0 alone under torchrun) and return the facts
    for the stage's metrics and MLflow params."""
    threads, why, warning = _thread_choice(impl.threads)
    torch.set_num_threads(threads)
    facts: dict[str, Any] = {"device": device.type, "threads": threads, "precision_asked": impl.precision}
    if device.type == "cpu" and impl.precision != "fp32":
        probe = cpu_bf16_probe()
        facts |= {"bf16_probe": probe.outcome, "bf16_probe_gflops": probe.bf16_gflops,
                  "fp32_probe_gflops": probe.fp32_gflops}
        reason = (f"{impl.precision}: bf16 probe on this CPU: {probe.describe()}; "
                  f"cached in {_shown(probe_cache_file(threads))}")
    else:
        reason = "as set" if impl.precision == "fp32" else f"{impl.precision}: bf16 on {device.type}"
    facts["precision"] = resolve_precision(impl.precision, device)
    if os.environ.get("RANK", "0") == "0":
        if warning:
            print(f"warning: {warning}", file=sys.stderr, flush=True)
        print(f"runtime: {device.type}, {threads} thread{'s' if threads > 1 else ''} ({why}), "
              f"precision {facts['precision']} ({reason})", flush=True)
    return facts


def _shown(path: Path) -> str:
    """`path` with the home folder written ~, as a user would type it."""
    try:
        return f"~/{path.relative_to(Path.home())}"
    except ValueError:
        return str(path)
