"""Upload a model folder the pipeline wrote to the Hugging Face hub, as a model repo.

    python -m lib.serving.hub_upload models/distill/imdb --repo <user or org>/<name> [--private] [--revision BRANCH]

The folder is checked first: the model's config and weights, its tokenizer and its model card (README.md,
lib/serving/model_card.py) must be there, or it is refused in one line. Then, through huggingface_hub, the
repo is created where there is none (`--private`: a new repo is private; an existing one keeps its
visibility), so is the branch `--revision`, and every file of the folder goes up in a commit on it. The
token is the one `hf auth login` saved, or HF_TOKEN; HF_ENDPOINT names another hub than huggingface.co.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from huggingface_hub import HfApi
from huggingface_hub.utils import HFValidationError, validate_repo_id

from lib.config.errors import UserError
from lib.core.errors import describe, run_main
from lib.data.tokenizer import TOKENIZER_FILE
from lib.models.folder import CONFIG_FILE, MODEL_FILE
from lib.serving.model_card import CARD_FILE

# what a model folder needs on the hub: what transformers and TextClassifier load, and the card that explains it
REQUIRED = {CONFIG_FILE: "the model config", MODEL_FILE: "the weights", TOKENIZER_FILE: "the tokenizer",
            "tokenizer_config.json": "the tokenizer's settings", CARD_FILE: "the model card"}


def check_folder(folder: Path) -> None:
    """Refuse, in one line, a folder that is not a whole model folder with its card."""
    if not folder.is_dir():
        raise UserError(f"{folder}: not a folder; name a model folder the pipeline wrote, e.g. models/distill/imdb")
    for name, what in REQUIRED.items():
        if not (folder / name).is_file():
            raise UserError(f"{folder}: no {name} ({what}); upload a model folder the pipeline wrote whole, or run "
                            "the stage that writes it again (dvc repro), which writes its model card too")


def upload(folder: Path, repo: str, private: bool = False, revision: str | None = None,
           message: str | None = None) -> str:
    """Upload `folder` (checked first) to the hub's model repo `repo`, on branch `revision` (default: the main
    branch), creating what is missing; returns the commit's URL."""
    check_folder(folder)
    try:
        validate_repo_id(repo)
    except HFValidationError as err:
        raise UserError(f"--repo: '{repo}' is not a hub repo id ({describe(err)}); write <user or org>/<name>") from None
    api = HfApi()
    try:
        api.create_repo(repo, private=private, exist_ok=True)
        if revision:
            api.create_branch(repo, branch=revision, exist_ok=True)
        commit = api.upload_folder(repo_id=repo, folder_path=folder, revision=revision,
                                   commit_message=message or f"Upload {folder.name} (transfer-pipeline)")
    except Exception as err:  # offline, refused, unauthorized, not found: huggingface_hub raises many kinds
        raise UserError(f"cannot upload {folder} to {api.endpoint}/{repo} ({describe(err)}); check the network, the "
                        "repo id and your rights on it, and log in (hf auth login, or set HF_TOKEN)") from None
    return commit.commit_url


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a model folder the pipeline wrote, e.g. models/distill/imdb")
    parser.add_argument("--repo", required=True, help="the hub's model repo: <user or org>/<name>")
    parser.add_argument("--private", action="store_true", help="make the repo private if it is created now")
    parser.add_argument("--revision", help="the branch to commit to (created if missing); default: main")
    parser.add_argument("--message", help="the commit message")
    args = parser.parse_args(argv)
    print(upload(args.folder, args.repo, args.private, args.revision, args.message))


if __name__ == "__main__":
    run_main(main)
