"""One-line messages: credentials never reach what the project prints."""
from lib.core.errors import describe, redact


def test_redact_masks_url_passwords_secret_query_values_and_mlflow_credentials(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "tok-123456")
    text = ("API request to https://alice:s3cr%40t@mlflow.example.com:5000/api/2.0/runs?access_token=abc&run=1 "
            "failed; sent Bearer tok-123456 to http://bob@host/?api_key=k3y")
    assert redact(text) == ("API request to https://alice:***@mlflow.example.com:5000/api/2.0/runs?access_token=***"
                            "&run=1 failed; sent Bearer *** to http://bob@host/?api_key=***")
    untouched = "sqlite:////work/mlflow.db; http://127.0.0.1:5000/path at 10:30 (user@example.com)"
    assert redact(untouched) == untouched
    assert describe(RuntimeError("cannot reach http://u:pw@h:1/\nsecond line")) == "RuntimeError: cannot reach http://u:***@h:1/"
