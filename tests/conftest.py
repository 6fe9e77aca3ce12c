"""Shared fixtures: the real params.yaml as a dict, tiny local datasets, offline `datasets` caches."""
import copy
import gzip
import json
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture(autouse=True)
def offline_caches(tmp_path_factory, monkeypatch):
    """Keep `datasets` and MLflow off the network and out of the user's home and the repo."""
    cache = tmp_path_factory.getbasetemp() / "hf-cache"
    monkeypatch.setenv("HF_HOME", str(cache))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)


@pytest.fixture
def default_params() -> dict:
    return copy.deepcopy(yaml.safe_load((ROOT / "params.yaml").read_text()))


def write_jsonl_gz(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def write_params(path: Path, params: dict) -> Path:
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


@pytest.fixture
def chdir_root(monkeypatch):
    """Relative sources in params.yaml (../shared/data/...) resolve from the project root."""
    monkeypatch.chdir(ROOT)
    return ROOT

