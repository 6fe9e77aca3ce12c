"""lib.serving.hub_upload against a stand-in of the Hugging Face hub: a local HTTP server that answers the
calls huggingface_hub makes to create a repo and a branch and to commit files (preupload: every file
"regular", so the commit carries their bytes inline, base64 in its NDJSON); and the folders it refuses."""
import base64
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from lib.config.params import load_params
from lib.core.errors import run_main
from lib.serving.hub_upload import main
from lib.serving.model_card import CARD_FILE, write_model_card
from lib.tasks import saved_type
from lib.tasks.model import card_facts, load_task_model
from tests.helpers import ROOT, save_tiny_classifier, tiny_tokenizer

TOKEN = "hf_stand_in_token"


class HubStandIn(BaseHTTPRequestHandler):
    """The hub's write API as far as create_repo, create_branch and upload_folder use it; what it was sent is
    kept on the server (`calls`, `repos`, `branches`, `commits`)."""

    def do_POST(self) -> None:
        hub = self.server
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        path = self.path.split("?")[0]
        hub.calls.append((path, self.headers.get("Authorization")))
        parts = path.strip("/").split("/")
        if path == "/api/repos/create":
            request = json.loads(body)
            repo = f"{request['organization']}/{request['name']}"
            status = 409 if repo in hub.repos else 200
            hub.repos.setdefault(repo, request)
            return self.answer({"url": f"http://{self.headers['Host']}/{repo}"}, status)
        if path == "/api/validate-yaml":  # the card's metadata, checked before anything goes up
            return self.answer({})
        if len(parts) == 6 and parts[:2] == ["api", "models"]:
            repo, action, revision = f"{parts[2]}/{parts[3]}", parts[4], parts[5]
            if action == "branch":
                hub.branches.append((repo, revision))
                return self.answer({})
            if action == "preupload":
                files = json.loads(body)["files"]
                return self.answer({"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                              for f in files]})
            if action == "commit":
                lines = [json.loads(line) for line in body.decode().splitlines()]
                assert all(line["key"] in ("header", "file") for line in lines), lines
                files = {line["value"]["path"]: base64.b64decode(line["value"]["content"]) for line in lines
                         if line["key"] == "file"}
                hub.commits.append((repo, revision, files))
                oid = f"{len(hub.commits):040x}"
                return self.answer({"commitUrl": f"http://{self.headers['Host']}/{repo}/commit/{oid}",
                                    "commitOid": oid})
        self.answer({"error": f"the stand-in has no {path}"}, 404)

    def answer(self, payload: dict, status: int = 200) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:  # quiet
        pass


@pytest.fixture
def hub():
    server = ThreadingHTTPServer(("127.0.0.1", 0), HubStandIn)
    server.calls, server.repos, server.branches, server.commits = [], {}, [], []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A classifier folder as finetune keeps it, its card included."""
    root = tmp_path_factory.mktemp("upload")
    source = save_tiny_classifier(root / "source", tiny_tokenizer(root / "tok"))
    _, info = load_task_model(source)
    measured = {**info, "task": "imdb", "type": "classification", "variant": "ulmfit", "seed": 1337, "dev": {"accuracy": 0.5}, "eval": None,
                "eval_split": "test", **card_facts(saved_type(info)), "params": 1, "best_epoch": 1,
                "examples": {"train": 9, "dev": 1, "eval": 0}}
    write_model_card(source, "finetune", load_params(ROOT / "params.yaml"), measured)
    return source


def upload(hub, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m lib.serving.hub_upload ...` as a user runs it, pointed at the stand-in (HF_ENDPOINT is read
    when huggingface_hub is imported: a process of its own)."""
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{hub.server_port}", "HF_TOKEN": TOKEN,
           "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "lib.serving.hub_upload", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def files_of(folder: Path) -> dict[str, bytes]:
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


@pytest.mark.parametrize("no_xet", ["0", "1"], ids=["pipelined-upload", "create-commit"])
def test_every_file_of_the_folder_reaches_the_hub_with_its_bytes(hub, folder, no_xet):
    """huggingface_hub uploads through its pipeline where hf_xet is installed, else through create_commit:
    both land every file of the folder, byte for byte, in one commit, after the hub checked the card's
    metadata."""
    done = upload(hub, str(folder), "--repo", "someone/tiny-imdb", "--private", env={"HF_HUB_DISABLE_XET": no_xet})
    assert done.returncode == 0, done.stderr[-3000:]
    [(repo, revision, files)] = hub.commits
    assert (repo, revision) == ("someone/tiny-imdb", "main") and files == files_of(folder)
    assert CARD_FILE in files and "model.safetensors" in files
    created = hub.repos["someone/tiny-imdb"]
    assert created["name"] == "tiny-imdb" and (created.get("visibility") == "private" or created.get("private"))
    assert [path for path, _ in hub.calls][:2] == ["/api/repos/create", "/api/validate-yaml"]
    assert done.stdout.strip().endswith(f"/someone/tiny-imdb/commit/{1:040x}")
    assert {auth for _, auth in hub.calls} == {f"Bearer {TOKEN}"}


def test_a_revision_is_a_branch_made_where_missing_in_a_repo_that_exists(hub, folder):
    for _ in range(2):
        done = upload(hub, str(folder), "--repo", "someone/tiny-imdb", "--revision", "run-1")
        assert done.returncode == 0, done.stderr[-3000:]
    assert hub.branches == [("someone/tiny-imdb", "run-1")] * 2  # the second: exists (the stand-in says yes)
    assert [(repo, revision) for repo, revision, _ in hub.commits] == [("someone/tiny-imdb", "run-1")] * 2
    assert [path for path, _ in hub.calls].count("/api/repos/create") == 2


@pytest.mark.parametrize("damage, message", [
    (lambda folder: (folder / CARD_FILE).unlink(), "no README.md (the model card); upload a model folder"),
    (lambda folder: (folder / "model.safetensors").unlink(), "no model.safetensors (the weights)"),
    (lambda folder: (folder / "tokenizer.json").unlink(), "no tokenizer.json (the tokenizer)"),
])
def test_a_folder_missing_a_part_is_refused_in_one_line(folder, tmp_path, capsys, damage, message):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    damage(broken)
    with pytest.raises(SystemExit) as end:
        run_main(lambda: main([str(broken), "--repo", "someone/tiny-imdb"]))
    err = capsys.readouterr().err
    assert end.value.code == 2 and err.startswith(f"error: {broken}: {message}") and err.count("\n") == 1


@pytest.mark.parametrize("args, message", [
    (["{tmp}/nowhere", "--repo", "someone/x"], "{tmp}/nowhere: not a folder"),
    (["{folder}", "--repo", "not a/repo id!"], "--repo: 'not a/repo id!' is not a hub repo id"),
])
def test_a_bad_folder_or_repo_id_is_refused_in_one_line(folder, tmp_path, capsys, args, message):
    args = [arg.format(tmp=tmp_path, folder=folder) for arg in args]
    with pytest.raises(SystemExit) as end:
        run_main(lambda: main(args))
    err = capsys.readouterr().err
    assert end.value.code == 2 and err.startswith(f"error: {message.format(tmp=tmp_path)}") and err.count("\n") == 1


def test_an_unreachable_hub_is_one_line(folder):
    done = subprocess.run([sys.executable, "-m", "lib.serving.hub_upload", str(folder), "--repo", "someone/x"],
                          cwd=ROOT, env={**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"error: cannot upload {folder} to http://127.0.0.1:9/someone/x (ConnectError")
