"""Does a change keep the pipeline's results? Runs the tests' tiny project (tests/test_pipeline.py's data and
params, at fp32) through `dvc repro` at each given commit, then once more up to adapt per `--pretrain` (params
set as `key=value` pairs, e.g. "objective=mlm mlm.sentence=sop"; each on the default params), and
compares what the runs wrote: model folders, data and plots byte for byte, metrics JSON value by value with
the timings left out (they differ from run to run).

    python bench/same_outputs.py BEFORE AFTER [--pretrain objective=electra --pretrain ...] [--work /tmp/same]

Prints, per file, `same` or what differs, and exits 1 when anything but a timing differs. Each commit runs
with its own code and its own tests' tiny params, in a worktree under --work (kept, and used again by the
next call with the same commit and settings); ../shared must sit beside the repository, as for the tests.
"""
import argparse
import csv
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPARED = ("models", "metrics", "plots", "reports", "data")
NOT_COMPARED = ("data/checkpoints",)  # resumable state: holds wall-clock counters, rebuilt by every run
# metric keys and CSV columns that time or count time; everything else must be equal. An ONNX file's size
# also differs from run to run: the exporter records the source path of every traced module in it.
TIMING = re.compile(r"seconds|minutes|_s$|per_s|latency|throughput|speed|elapsed|wall|_ms|ms_|time|date|"
                    r"onnx\.[^.]+\.disk_bytes$")
# what a run records of itself (commit, date, run ids) and timing figures: shown as lines that differ
RECORDS = (".md",)
TIMED = ("reports/speed.png",)
BUILD = """
import sys, yaml
from pathlib import Path

import yaml
from tests.test_pipeline import run, tiny_repo
repo, _ = tiny_repo(Path(sys.argv[1]))
params = yaml.safe_load((repo / "params.yaml").read_text())
params["impl"]["precision"] = "fp32"
(repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
run(repo, "git", "commit", "-qam", "fp32")
"""


def sh(cwd: Path, *args: str) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "DVC_NO_ANALYTICS": "1",
                               "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    if done.returncode:
        sys.exit(f"{' '.join(args)} failed in {cwd}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return done.stdout


def outputs(repo: Path) -> dict[str, bytes]:
    files = {}
    for top in COMPARED:
        for path in sorted((repo / top).rglob("*")):
            name = str(path.relative_to(repo))
            if path.is_file() and not name.startswith(NOT_COMPARED):
                files[name] = path.read_bytes()
    return files


def snapshot(repo: Path, into: Path) -> None:
    shutil.rmtree(into, ignore_errors=True)
    for name, data in outputs(repo).items():
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        (into / name).write_bytes(data)


def set_params(repo: Path, settings: str) -> None:
    """params.yaml with each `dotted.key=value` of `settings` set (values read as YAML)."""
    params = yaml.safe_load((repo / "params.yaml").read_text())
    for setting in settings.split():
        key, value = setting.split("=", 1)
        *parents, last = key.split(".")
        section = params
        for parent in parents:
            section = section[parent]
        section[last] = yaml.safe_load(value)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def run_commit(commit: str, base: Path, pretrains: list[str]) -> Path:
    """The tiny project's outputs at `commit`: base/runs/default, and base/runs/<n> for the n-th of
    `pretrains`. Runs kept from an earlier call with the same commit and settings are used again."""
    done = base / "runs" / "settings.json"
    if done.exists() and json.loads(done.read_text()) == pretrains:
        return base / "runs"
    shutil.rmtree(base, ignore_errors=True)
    subprocess.run(["git", "worktree", "prune"], cwd=ROOT, check=True)
    sh(ROOT, "git", "worktree", "add", "-q", "--detach", str(base / "src"), commit)
    (base / "shared").symlink_to((ROOT.parent / "shared").resolve())  # the tiny data is built from it
    sh(base / "src", sys.executable, "-c", BUILD, str(base / "tiny"))
    repo = base / "tiny" / "repo"
    sh(repo, "dvc", "repro")
    snapshot(repo, base / "runs" / "default")
    default = (repo / "params.yaml").read_text()
    for n, settings in enumerate(pretrains):
        (repo / "params.yaml").write_text(default)
        set_params(repo, settings)
        sh(repo, "dvc", "repro", "adapt")
        snapshot(repo, base / "runs" / str(n))
    sh(ROOT, "git", "worktree", "remove", "--force", str(base / "src"))
    done.write_text(json.dumps(pretrains))
    return base / "runs"


def flat(value, prefix: str = "") -> dict[str, object]:
    if isinstance(value, dict):
        return {k: v for key, inner in value.items() for k, v in flat(inner, f"{prefix}{key}.").items()}
    if isinstance(value, list):
        return {k: v for i, inner in enumerate(value) for k, v in flat(inner, f"{prefix}{i}.").items()}
    return {prefix.rstrip("."): value}


def differences(before: Path, after: Path) -> dict[str, str]:
    names = sorted({str(p.relative_to(before)) for p in before.rglob("*") if p.is_file()}
                   | {str(p.relative_to(after)) for p in after.rglob("*") if p.is_file()})
    found = {}
    for name in names:
        old, new = before / name, after / name
        if not old.exists() or not new.exists():
            found[name] = "only before" if old.exists() else "only after"
        elif old.read_bytes() != new.read_bytes():
            if name.endswith(".json"):
                a, b = flat(json.loads(old.read_text())), flat(json.loads(new.read_text()))
                keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k) and not TIMING.search(k)]
                found[name] = f"differs at {', '.join(keys[:8])}" if keys else "timings only"
            elif name.endswith(".csv"):
                a, b = (list(csv.DictReader(f.read_text().splitlines())) for f in (old, new))
                columns = [c for c in (a[0] if a else {}) if not TIMING.search(c)]
                same = len(a) == len(b) and all(r[c] == q.get(c) for r, q in zip(a, b) for c in columns)
                found[name] = "timings only" if same else "differs"
            elif name.endswith(RECORDS):
                lines = [(x, y) for x, y in zip(old.read_text().splitlines(), new.read_text().splitlines()) if x != y]
                found[name] = f"record: {len(lines)} lines differ (commit, date, run ids, timings?): check by eye"
            elif name in TIMED:
                found[name] = "timings only"
            else:
                found[name] = f"differs ({hashlib.sha256(old.read_bytes()).hexdigest()[:8]} -> "\
                              f"{hashlib.sha256(new.read_bytes()).hexdigest()[:8]})"
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--pretrain", action="append", default=[], help='params to pretrain and adapt with, '
                        'as "key=value key=value"')
    parser.add_argument("--work", type=Path, default=Path("/tmp/same"))
    args = parser.parse_args()
    commits = [sh(ROOT, "git", "rev-parse", "--short", rev).strip() for rev in (args.before, args.after)]
    runs = [run_commit(commit, args.work / f"{side}-{commit}", args.pretrain)
            for side, commit in zip(("before", "after"), commits)]
    real = 0
    for run, label in [("default", "default"), *((str(n), s) for n, s in enumerate(args.pretrain))]:
        for name, what in differences(runs[0] / run, runs[1] / run).items():
            print(f"{label}: {name}: {what}")
            real += not what.startswith(("timings only", "record:"))
        print(f"{label}: compared")
    sys.exit(1 if real else 0)


if __name__ == "__main__":
    main()
