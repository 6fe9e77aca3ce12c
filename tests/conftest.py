"""Fixtures: the real params.yaml as a dict, the project root as working directory, offline caches, and
the tiny project after one `dvc repro` (shared by the modules that start from it)."""
import copy
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from filelock import FileLock

from tests.helpers import ROOT


@pytest.fixture(scope="session", autouse=True)
def offline_caches(tmp_path_factory):
    """Keep `datasets` and MLflow off the network and out of the user's home and the repo, and the bf16
    probe's cache to one per test session. Session-wide, so module fixtures that run the pipeline
    (set up before any function fixture) and the processes they start see it too."""
    base = tmp_path_factory.getbasetemp()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HOME", str(base / "hf-cache"))
        patch.setenv("HF_DATASETS_OFFLINE", "1")
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("TRANSFER_PIPELINE_CACHE", str(base / "runtime-cache"))
        for name in ("MLFLOW_TRACKING_URI", "DVC_ROOT", "DVC_EXP_NAME"):
            patch.delenv(name, raising=False)
        yield


@pytest.fixture
def default_params() -> dict:
    return copy.deepcopy(yaml.safe_load((ROOT / "params.yaml").read_text()))


@pytest.fixture
def chdir_root(monkeypatch):
    """Relative sources in params.yaml (../shared/data/...) resolve from the project root."""
    monkeypatch.chdir(ROOT)
    return ROOT


@pytest.fixture(scope="session")
def reproduced(tmp_path_factory) -> tuple[Path, str, str]:
    """The tiny project of tests/test_pipeline.py after one `dvc repro` on the default `impl` settings: the
    folder holding it (repo/, with its mirror in shared/ beside it), the evaluation sentence planted in its
    pretraining text, and the repro's log. The chain runs once per test run: under pytest-xdist the first
    worker to need it builds it in the folder the workers share while the others wait (each building its
    own took both cores for two minutes); a test never changes this folder, it works on a copy
    (tests.test_pipeline.copy_reproduced)."""
    from tests.test_pipeline import run, tiny_repo
    own = tmp_path_factory.getbasetemp()
    shared = own.parent if os.environ.get("PYTEST_XDIST_WORKER") else own
    base, record = shared / "reproduced", shared / "reproduced.json"
    with FileLock(shared / "reproduced.lock"):
        if not record.exists():
            shutil.rmtree(base, ignore_errors=True)  # what a worker whose build failed left
            repo, planted = tiny_repo(base)
            record.write_text(json.dumps({"planted": planted, "log": run(repo, "dvc", "repro")}))
    built = json.loads(record.read_text())
    return base, built["planted"], built["log"]
