"""Fixtures: the real params.yaml as a dict, the project root as working directory, offline caches."""
import copy

import pytest
import yaml

from tests.helpers import ROOT


@pytest.fixture(autouse=True)
def offline_caches(tmp_path_factory, monkeypatch):
    """Keep `datasets` and MLflow off the network and out of the user's home and the repo (and the bf16
    probe's cache: one per test session)."""
    cache = tmp_path_factory.getbasetemp() / "hf-cache"
    monkeypatch.setenv("HF_HOME", str(cache))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFER_PIPELINE_CACHE", str(tmp_path_factory.getbasetemp() / "runtime-cache"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)


@pytest.fixture
def default_params() -> dict:
    return copy.deepcopy(yaml.safe_load((ROOT / "params.yaml").read_text()))


@pytest.fixture
def chdir_root(monkeypatch):
    """Relative sources in params.yaml (../shared/data/...) resolve from the project root."""
    monkeypatch.chdir(ROOT)
    return ROOT
