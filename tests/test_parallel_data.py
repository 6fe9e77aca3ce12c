"""Parallel text for XLM (corpora.parallel): params checked at load, the data stage reading a pair source
(local, and a hub layout mapped onto the mirror's), the clean stage cleaning pairs side by side, and the
tokenizer stage's pair and monolingual token files with their languages, and the pretrain stage training
objective tlm on them."""
import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lib.config.errors import UserError
from lib.config.params import CleanConfig, load_params
from lib.data.clean import build_contamination_index
from lib.data.packed import PackedTokens
from lib.data.parallel import PairCleaner, PairStats
from lib.data.raw import LAYOUTS, read_all
from lib.data.tokenizer import load_tokenizer, read_meta
from tests.helpers import ROOT, SHARED_DATA, write_jsonl_gz, write_params
from tests.test_raw import hub_repo

MULTI30K_EN_DE = "hf:bentrevett/multi30k@37e118600232bb5298ca011a8a7e7a44e863c36a"
CAPTION = "A man in a blue shirt is standing on a ladder cleaning windows."  # also an evaluation text below


def head(path: Path, n: int) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line, _ in zip(f, range(n))]


def pair(en: str, other: str, code: str = "de") -> dict:
    return {"translation": {"en": en, code: other}}


def tiny_project(base: Path) -> Path:
    """Local sources (a few Wikipedia articles, IMDb reviews, Multi30k en-de and en-fr pairs with an empty,
    a repeated and a contaminated pair planted, a task whose evaluation text is one of the captions) and
    params over them, tracking off; returns the params file."""
    src = base / "src"
    write_jsonl_gz(src / "wiki" / "train.jsonl.gz", [{"text": r["text"][:3000]} for r in
                                                      head(SHARED_DATA / "wikipedia_en" / "train.jsonl.gz", 8)])
    write_jsonl_gz(src / "wiki" / "validation.jsonl.gz", [{"text": r["text"][:3000]} for r in
                                                           head(SHARED_DATA / "wikipedia_en" / "validation.jsonl.gz", 2)])
    write_jsonl_gz(src / "reviews" / "train.jsonl.gz", head(SHARED_DATA / "imdb" / "unsup.jsonl.gz", 30))
    write_jsonl_gz(src / "task" / "train.jsonl.gz", [{"text": "a fine film", "label": 1}, {"text": "dull", "label": 0}])
    write_jsonl_gz(src / "task" / "validation.jsonl.gz", [{"text": CAPTION.upper(), "label": 1}])
    for code in ("de", "fr"):
        folder = SHARED_DATA / f"multi30k_en_{code}"
        train = head(folder / "train.jsonl.gz", 30)
        train += [pair(CAPTION, "Ein Mann.", code), pair("  An  empty side.", "", code), dict(train[0]),
                  pair(train[1]["translation"]["en"].upper(), train[1]["translation"][code], code)]
        write_jsonl_gz(src / f"en_{code}" / "train.jsonl.gz", train)
        write_jsonl_gz(src / f"en_{code}" / "validation.jsonl.gz", head(folder / "validation.jsonl.gz", 6))
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["tracking"]["enabled"] = False
    params["data"]["mirror"] = None
    params["corpora"]["pretrain"] = {"source": str(src / "wiki"), "valid_split": "validation"}
    params["corpora"]["domain"] = {"source": str(src / "reviews"), "valid_fraction": 0.2}
    params["tasks"] = {"caption": {"source": str(src / "task"), "label_names": ["no", "yes"]}}
    params["finetune"].update(tasks=["caption"], max_train_examples=None)
    params["distill"]["unlabeled"] = {}
    params["evaluate"]["zero_shot"] = {}
    params["clean"].update(min_chars=20, workers=1, near_dedup={"enabled": False})
    params["tokenizer"].update(vocab_size=600, train_chars=None, min_frequency=1)
    params["model"]["languages"] = ["en", "de", "fr"]
    params["corpora"]["parallel"] = {"en_de": {"source": str(src / "en_de"), "languages": ["en", "de"]},
                                     "en_fr": {"source": str(src / "en_fr"), "languages": ["en", "fr"]}}
    return write_params(base / "params.yaml", params)


def stage(name: str, params: Path, *paths: str) -> subprocess.CompletedProcess:
    """Run stage `name` as DVC does (from the project root, where dvc.yaml is), its paths under the params' folder."""
    base = params.parent
    args = [arg if arg.startswith("--") else str(base / arg) for arg in paths]
    return subprocess.run([sys.executable, "-m", f"stages.{name}", "--params", str(params), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def pretrain(params: Path, tokens: Path) -> subprocess.CompletedProcess:
    """The pretrain stage on the tokenizer stage's folder `tokens`, its outputs under the params' folder."""
    return stage("pretrain", params, "--tokenizer", str(tokens / "tokenizer"), "--tokens", str(tokens / "pretrain"),
                 "--parallel", str(tokens / "parallel"), "--out", "model", "--metrics", "pretrain.json",
                 "--plots", "plots", "--checkpoints", "checkpoints")


def tiny_pretraining(params: dict, steps: int) -> None:
    """A one-layer model pretrained for `steps` steps of 4 x 32 tokens, validated at the end."""
    params["model"].update(d_model=32, n_layers=1, n_heads=2, d_ff=64)
    params["pretrain"].update(seq_len=32, batch_size=4, budget_tokens=4 * 32 * steps, eval_every=steps,
                              eval_batches=1, warmup_steps=1)


@pytest.fixture(scope="module")
def chain(tmp_path_factory) -> Path:
    """The tiny project after data, clean and tokenizer; returns its folder."""
    params = tiny_project(tmp_path_factory.mktemp("parallel"))
    for name, paths in {"data": ["--out", "raw", "--metrics", "metrics/data.json"],
                        "clean": ["--raw", "raw", "--out", "clean", "--metrics", "metrics/clean.json",
                                  "--plots", "plots/clean"],
                        "tokenizer": ["--clean", "clean", "--out", "tokens", "--metrics", "metrics/tokenizer.json",
                                      "--plots", "plots/tokenizer"]}.items():
        done = stage(name, params, *paths)
        assert done.returncode == 0, f"{name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return params.parent


def error_of(tmp_path: Path, change) -> str:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["corpora"]["parallel"] = {"en_de": {"source": MULTI30K_EN_DE, "languages": ["en", "de"]}}
    params["model"]["languages"] = ["en", "de"]
    change(params)
    with pytest.raises(UserError) as info:
        load_params(write_params(tmp_path / "params.yaml", params))
    assert "\n" not in str(info.value)
    return str(info.value)


@pytest.mark.parametrize("change, message", [
    (lambda p: p["model"].update(languages=["en"]),
     "corpora.parallel.en_de.languages: de is not in model.languages [en]; add it"),
    (lambda p: p["model"].update(languages=["de", "fr"]),
     "corpora.pretrain.language: en is not in model.languages [de, fr]; add it"),
    (lambda p: p["corpora"]["domain"].update(language="fr"),
     "corpora.domain.language: fr is not in model.languages [en, de]; add it"),
    (lambda p: p["corpora"]["parallel"]["en_de"].update(languages=["en", "en"]),
     "corpora.parallel.en_de.languages: [en, en] must be two distinct language codes"),
    (lambda p: p["corpora"]["parallel"]["en_de"].update(languages=["en", "de", "fr"]),
     "corpora.parallel.en_de.languages: [en, de, fr] must be two distinct language codes"),
    (lambda p: p["corpora"]["parallel"]["en_de"].pop("languages"), "corpora.parallel.en_de.languages: required key"),
    (lambda p: p["corpora"]["parallel"]["en_de"].update(lang=["en", "de"]),
     "corpora.parallel.en_de.lang: unknown key; did you mean 'corpora.parallel.en_de.languages'?"),
    (lambda p: p["corpora"]["parallel"]["en_de"].update(splits=["train", "validation"]),
     "corpora.parallel.en_de.valid_split: 'validation' is also in corpora.parallel.en_de.splits"),
    (lambda p: p["corpora"]["parallel"]["en_de"].update(max_pairs=0), "corpora.parallel.en_de.max_pairs: 0 must be >= 1"),
    (lambda p: p["corpora"]["parallel"].update({"../x": p["corpora"]["parallel"].pop("en_de")}),
     "corpora.parallel.../x: not a usable corpus name"),
    (lambda p: p["corpora"].update(parallel=[MULTI30K_EN_DE]), "corpora.parallel: expected a mapping"),
])
def test_bad_parallel_params_stop_at_load_in_one_line_naming_the_key(tmp_path, change, message):
    assert message in error_of(tmp_path, change)


def test_languages_are_not_checked_for_a_monolingual_chain(tmp_path):
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["corpora"]["pretrain"]["language"] = "de"  # no parallel corpus: nothing is tagged
    assert load_params(write_params(tmp_path / "params.yaml", params)).corpora.languages() == []


def test_the_hub_multi30k_is_mapped_onto_the_mirror_layout(tmp_path, monkeypatch):
    """bentrevett/multi30k has one field per language; the mirror copy (and so data/raw) the translation layout."""
    import datasets

    rows = {split: head(SHARED_DATA / "multi30k_en_de" / f"{split}.jsonl.gz", 5) for split in ("train", "validation")}
    write_jsonl_gz(tmp_path / "mirror" / "multi30k_en_de" / "train.jsonl.gz", rows["train"])
    write_jsonl_gz(tmp_path / "mirror" / "multi30k_en_de" / "validation.jsonl.gz", rows["validation"])
    repo = hub_repo(tmp_path / "hub", None, {split: [r["translation"] for r in split_rows]
                                             for split, split_rows in rows.items()})
    load, split_names = datasets.load_dataset, datasets.get_dataset_split_names
    hub = {"bentrevett/multi30k": str(repo)}  # where `datasets` looks the id up; local files read as they do
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config=None, revision=None, **kw:
                        load(hub.get(name, name), config, **kw))
    monkeypatch.setattr(datasets, "get_dataset_split_names", lambda name, config=None, revision=None:
                        split_names(hub[name]))
    for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)
    assert LAYOUTS["bentrevett/multi30k", None].hub_row({"de": "Hallo", "en": "Hello"}) == {
        "translation": {"en": "Hello", "de": "Hallo"}}
    text = tmp_path / "text"  # the other corpora and a task: one local folder
    write_jsonl_gz(text / "train.jsonl.gz", [{"text": "some text"}])
    write_jsonl_gz(text / "validation.jsonl.gz", [{"text": "more text"}])
    raws = {}
    for mirror in (tmp_path / "mirror", None):
        params = yaml.safe_load((ROOT / "params.yaml").read_text())
        params["data"]["mirror"] = None if mirror is None else str(mirror)
        params["model"]["languages"] = ["en", "de"]
        params["corpora"]["pretrain"] = params["corpora"]["domain"] = {"source": str(text), "valid_split": "validation"}
        params["corpora"]["parallel"] = {"en_de": {"source": MULTI30K_EN_DE, "languages": ["en", "de"]}}
        params["tasks"] = {"t": {"source": str(text)}}
        params["finetune"].update(tasks=["t"], max_train_examples=None)
        params["distill"]["unlabeled"] = {}
        params["evaluate"]["zero_shot"] = {}
        out = tmp_path / f"raw-{'mirror' if mirror else 'hub'}"
        report = read_all(load_params(write_params(tmp_path / "params.yaml", params)), out)
        assert report["multi30k_en_de"]["used_by"] == ["corpora.parallel.en_de"]
        assert report["multi30k_en_de"]["origin"].split()[0] == ("mirror" if mirror else "hub")
        raws[out.name] = {p.name: p.read_bytes() for p in (out / "multi30k_en_de").glob("*.jsonl.gz")}
    assert raws["raw-hub"] == raws["raw-mirror"] and sorted(raws["raw-hub"]) == ["train.jsonl.gz", "validation.jsonl.gz"]


def test_pairs_are_cleaned_side_by_side():
    cfg = CleanConfig()
    contamination = build_contamination_index([CAPTION], cfg)
    stats = PairStats()
    pairs = [("A  dog\u200b runs.", "Ein Hund\tläuft."), ("", "Leer."), ("A dog runs.", "ein hund läuft."),
             ("Two men: " + CAPTION.lower(), "Zwei Männer."), ("Bad \ufffd bytes.", "Schlecht."),
             ("A cat sleeps.", "Eine Katze schläft.")]
    kept = list(PairCleaner(cfg, contamination).run(pairs, stats))
    assert kept == [("A dog runs.", "Ein Hund läuft."), ("A cat sleeps.", "Eine Katze schläft.")]
    assert stats.as_dict()["dropped"] == {"empty": 1, "undecodable": 1, "contaminated": 1, "exact_dup": 1}
    assert (stats.pairs_in, stats.pairs_out) == (6, 2)
    assert stats.rewritten["remove_control_chars"] == 1 and stats.rewritten["collapse_whitespace"] == 2


def test_the_data_stage_reads_a_local_pair_source_and_clean_drops_bad_pairs(chain):
    data = json.loads((chain / "metrics" / "data.json").read_text())
    en_de = next(r for r in data.values() if r["used_by"] == ["corpora.parallel.en_de"])
    assert en_de["rows"] == {"train": 34, "validation": 6} and en_de["origin"].startswith("local")
    clean = json.loads((chain / "metrics" / "clean.json").read_text())["parallel"]
    for name in ("en_de", "en_fr"):  # each: the empty pair, the contaminated one and two repeats
        assert clean[name]["dropped"] == {"empty": 1, "undecodable": 0, "contaminated": 1, "exact_dup": 2}
        assert clean[name]["train_pairs"] == 30 and clean[name]["valid_pairs"] == 6
    rows = head(chain / "clean" / "parallel" / "en_fr" / "valid.jsonl.gz", 10)
    expected = head(SHARED_DATA / "multi30k_en_fr" / "validation.jsonl.gz", 6)
    assert rows == [{"en": r["translation"]["en"], "fr": r["translation"]["fr"]} for r in expected]


def test_the_pair_tokens_hold_each_pair_as_two_documents_with_their_languages(chain):
    tokenizer = load_tokenizer(chain / "tokens" / "tokenizer")
    pairs = [tuple(r.values()) for name in ("en_de", "en_fr")
             for r in head(chain / "clean" / "parallel" / name / "train.jsonl.gz", 100)]
    tokens = PackedTokens(chain / "tokens" / "parallel" / "train")
    assert tokens.n_docs == 2 * len(pairs) == 120 and tokens.languages == ["en", "de", "fr"]
    for i, (first, second) in enumerate(pairs):
        assert tokenizer.decode(tokens.doc(2 * i).tolist()) == first
        assert tokenizer.decode(tokens.doc(2 * i + 1).tolist()) == second
    starts = tokens.doc_offsets
    languages = [tokens.languages[tokens.language_ids[starts[i]]] for i in range(tokens.n_docs)]
    assert languages == ["en", "de"] * 30 + ["en", "fr"] * 30
    assert all(len(set(tokens.language_ids[starts[i]:starts[i + 1]].tolist())) == 1 for i in range(tokens.n_docs))
    metrics = json.loads((chain / "metrics" / "tokenizer.json").read_text())["parallel"]
    assert metrics["valid"]["en_fr"]["pairs"] == 6
    assert metrics["train"]["en_de"]["tokens"] == sum(len(tokens.doc(i)) for i in range(60))
    assert metrics["train"]["en_fr"]["tokens"] == sum(len(tokens.doc(i)) for i in range(60, 120))


def test_the_pretraining_tokens_gain_each_languages_sentences_tagged(chain):
    tokenizer = load_tokenizer(chain / "tokens" / "tokenizer")
    tokens = PackedTokens(chain / "tokens" / "pretrain" / "train")
    clean = [r["text"] for r in head(chain / "clean" / "pretrain" / "train.jsonl.gz", 10**6)]
    en_de = [tuple(r.values()) for r in head(chain / "clean" / "parallel" / "en_de" / "train.jsonl.gz", 100)]
    en_fr = [tuple(r.values()) for r in head(chain / "clean" / "parallel" / "en_fr" / "train.jsonl.gz", 100)]
    # the English captions of en-de and en-fr are the same: each language's distinct sentences once, one
    # language after another, so that no sentence sits beside its translation (mlm is tlm's control)
    english = [en for en, _ in en_de] + [en for en, _ in en_fr]
    expected = [("en", t) for t in clean] + [(language, t) for language, texts in (
        ("en", english), ("de", [de for _, de in en_de]), ("fr", [fr for _, fr in en_fr])) for t in dict.fromkeys(texts)]
    assert len({en for en, _ in en_de} & {en for en, _ in en_fr}) > 20
    assert tokens.n_docs == len(expected)
    for i, (language, text) in enumerate(expected):
        assert tokens.languages[tokens.language_ids[tokens.doc_offsets[i]]] == language
        assert tokenizer.decode(tokens.doc(i).tolist()) == text
    domain = PackedTokens(chain / "tokens" / "domain" / "valid")
    assert domain.languages == ["en", "de", "fr"] and not domain.language_ids.any()
    # one vocabulary: the tokenizer learned from both sides of every train pair, beyond the pretraining text
    assert read_meta(chain / "tokens" / "tokenizer")["train_docs"] == len(clean) + 2 * (len(en_de) + len(en_fr))


def changed_params(chain: Path, folder: Path, change) -> Path:
    """The chain's params with `change` made, in `folder`."""
    params = yaml.safe_load((chain / "params.yaml").read_text())
    change(params)
    folder.mkdir()
    return write_params(folder / "params.yaml", params)


def test_a_monolingual_chain_has_no_languages_and_no_pairs(chain, tmp_path):
    def monolingual(params):
        params["corpora"]["parallel"] = {}
        params["model"]["languages"] = []

    params = changed_params(chain, tmp_path / "mono", monolingual)
    done = stage("tokenizer", params, "--clean", str(chain / "clean"), "--out", "tokens", "--metrics", "tokenizer.json",
                 "--plots", "plots")
    assert done.returncode == 0, done.stderr[-2000:]
    assert PackedTokens(tmp_path / "mono" / "tokens" / "pretrain" / "train").language_ids is None
    pairs = PackedTokens(tmp_path / "mono" / "tokens" / "parallel" / "train")
    assert pairs.n_docs == 0 and pairs.language_ids is None
    assert "parallel" not in json.loads((tmp_path / "mono" / "tokenizer.json").read_text())

    def with_languages(params):  # a model with language embeddings on untagged text reads the first one's
        monolingual(params)
        params.update(objective="mlm")
        params["model"].update(languages=["en", "de"])
        tiny_pretraining(params, steps=2)

    done = pretrain(changed_params(chain, tmp_path / "mlm", with_languages), tmp_path / "mono" / "tokens")
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_record_without_one_of_the_languages_is_one_line_and_leaves_no_output(chain, tmp_path):
    def czech(params):
        params["corpora"]["parallel"]["en_de"]["languages"] = ["en", "cs"]
        params["model"]["languages"].append("cs")

    params = changed_params(chain, tmp_path / "cs", czech)
    done = stage("clean", params, "--raw", str(chain / "raw"), "--out", "clean", "--metrics", "clean.json",
                 "--plots", "plots")
    assert done.returncode == 2 and not (tmp_path / "cs" / "clean").exists()
    assert done.stderr.strip().splitlines()[-1].startswith(
        "error: corpora.parallel.en_de.languages: cs is not a language of field 'translation' of ")


def test_the_pretrain_stage_trains_tlm_on_the_pairs_and_the_windows_languages(chain, tmp_path):
    """XLM end to end from the tokenizer's files: tlm reports both losses, and its FLOPs per token count
    the pairs beside the windows (above mlm's on the same stream)."""
    def small(objective):
        def change(params):
            params["objective"] = objective
            tiny_pretraining(params, steps=3)
            params["tlm"]["pair_batch"] = 4
        return change

    flops = {}
    for objective in ("tlm", "mlm"):
        folder = tmp_path / objective
        params = changed_params(chain, folder, small(objective))
        done = pretrain(params, chain / "tokens")
        assert done.returncode == 0, done.stderr[-2000:]
        metrics = json.loads((folder / "pretrain.json").read_text())
        flops[objective] = metrics["flops_per_token"]
        assert metrics["steps"] == 3 and metrics["objective"] == objective
        assert ("val_tlm_accuracy" in metrics) == (objective == "tlm")
        assert json.loads((folder / "model" / "config.json").read_text())["languages"] == ["en", "de", "fr"]
    assert flops["tlm"] > flops["mlm"]


def test_a_tlm_model_in_xlms_shape_loads_as_transformers_xlm(chain, tmp_path):
    """In XLM's shape the pretrain stage's folder is transformers' XLMWithLMHeadModel: its tokenizer and
    model give our logits on a translation pair (languages per side, positions restarting)."""
    transformers = pytest.importorskip("transformers")
    import torch

    from lib.models.folder import load_model

    def xlm_shape(params):
        params["objective"] = "tlm"
        tiny_pretraining(params, steps=2)
        params["tlm"]["pair_batch"] = 4
        params["model"].update(position="learned", norm="post", lm_head="linear", d_ff=4 * params["model"]["d_model"])

    folder = tmp_path / "xlm"
    done = pretrain(changed_params(chain, folder, xlm_shape), chain / "tokens")
    assert done.returncode == 0, done.stderr[-2000:]
    config = json.loads((folder / "model" / "config.json").read_text())
    assert config["model_type"] == "xlm" and config["lang2id"] == {"en": 0, "de": 1, "fr": 2}
    card = (folder / "model" / "README.md").read_text()
    assert "pipeline_tag: fill-mask" in card and "language:\n- en\n- de\n- fr\n" in card
    assert "- Languages: en (0), de (1), fr (2); every token adds its language's embedding, chosen by its id " \
           "(`langs` in `transformers`' XLM). A text given no ids reads as en." in card
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder / "model")
    en, de = (tokenizer(text)["input_ids"] for text in (CAPTION, "Ein Mann in einem blauen Hemd steht auf einer Leiter."))
    ids = torch.tensor([en + de])
    languages = torch.tensor([[0] * len(en) + [1] * len(de)])
    positions = torch.tensor([[*range(len(en)), *range(len(de))]])
    ours = load_model(folder / "model")
    with torch.no_grad():
        expected = ours.lm_logits(ours(ids, None, None, language_ids=languages, position_ids=positions))
        theirs = transformers.XLMWithLMHeadModel.from_pretrained(folder / "model").eval()(
            input_ids=ids, langs=languages, position_ids=positions).logits
    assert (theirs - expected).abs().max() < 1e-4
