"""Fixtures: the real params.yaml as a dict, the project root as working directory, offline caches."""
import copy

import pytest
import yaml

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
