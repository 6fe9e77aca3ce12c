"""Cleaning rules, drop filters, statistics and the streaming cleaner on hand-made documents."""
import multiprocessing
import random
from dataclasses import replace

import pytest

from lib.data.clean import REWRITE_RULES, CleanStats, DocumentCleaner, build_contamination_index, clean_text, \
    filter_reason, letter_ratio
from lib.config.params import CleanConfig, CorpusConfig, DecontaminateConfig
from lib.data.corpus import planned_docs

ONLY = {rule: CleanConfig(**{other: other == rule for other in REWRITE_RULES}) for rule in REWRITE_RULES}
CFG = CleanConfig(min_chars=50, max_chars=5000, workers=1, batch_docs=4)


def document(seed: int, n_words: int = 200) -> str:
    """A clean document of random lowercase words (letters only, so never junk)."""
    rng = random.Random(seed)
    return " ".join("".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 9))) for _ in range(n_words))


def run(docs, cfg=CFG, contamination=None, cleaner=None):
    stats = CleanStats()
    cleaner = cleaner or DocumentCleaner(cfg, contamination, seed=0)
    return list(cleaner.run(docs, stats)), stats


@pytest.mark.parametrize("rule, text, expected", [
    ("unicode_nfkc", "ﬁne ｆｕｌｌ１２３ x²", "fine full123 x2"),
    ("unicode_nfkc", "line one\nno\u00a0break\nplain", "line one\nno break\nplain"),
    ("strip_html", "Great.<br /><br />Really<p>good</p>", "Great.  Really good "),
    ("strip_html", 'A <a href="x.html">link</a> &amp; Tom&#39;s', "A  link  & Tom's"),
    ("strip_html", "if a < b and c > d <!-- note --> ok", "if a < b and c > d   ok"),
    ("remove_control_chars", "zero\u200bwidth\x00 bell\x07 soft\xadhyphen\ufeff\tkept\n",
     "zerowidth bell softhyphen\tkept\n"),
    ("collapse_whitespace", "  a \t b  \n\n\n\n c \n d\t", "a b\n\nc\nd"),
])
def test_each_rule_rewrites_alone(rule, text, expected):
    assert clean_text(text, ONLY[rule]) == (expected, [rule])


def test_rules_run_in_order_and_report_what_changed():
    text, changed = clean_text("ｆｕｌｌ<br />width&amp;\u200b  text ", CleanConfig())
    assert text == "full width& text"
    assert changed == ["unicode_nfkc", "strip_html", "remove_control_chars", "collapse_whitespace"]
    assert clean_text("already clean text", CleanConfig()) == ("already clean text", [])


def test_switched_off_rules_leave_text_unchanged():
    off = CleanConfig(**dict.fromkeys(REWRITE_RULES, False))
    text = "ﬁ<br />&amp;\u200b  \n\n\n x "
    assert clean_text(text, off) == (text, [])


@pytest.mark.parametrize("text, reason", [
    ("a" * 60 + "\ufffd", "undecodable"),
    ("a" * 49, "too_short"),
    ("a" * 5001, "too_long"),
    ("12345 67890 " * 10 + "abc", "junk"),
    ("words " * 20, None),
])
def test_filter_reasons(text, reason):
    assert filter_reason(text, CFG) == reason


def test_letter_ratio_ignores_whitespace():
    assert letter_ratio("ab 12\n") == 0.5
    assert letter_ratio("  ") == 0.0


def test_stats_dict_lists_every_rule_and_reason():
    stats = CleanStats(docs_in=2, docs_out=1, chars_in=10, chars_out=4)
    stats.rewritten["strip_html"] += 1
    stats.dropped["junk"] += 1
    as_dict = stats.as_dict()
    assert as_dict["docs_in"] == 2 and as_dict["chars_in"] == 10
    assert as_dict["dropped"]["junk"] == 1 and as_dict["dropped"]["near_dup"] == 0
    assert as_dict["rewritten"] == {"unicode_nfkc": 0, "strip_html": 1, "remove_control_chars": 0,
                                    "collapse_whitespace": 0}


def test_exact_duplicates_are_dropped_across_case_and_whitespace():
    doc = document(1, 40)
    out, stats = run([doc, doc.upper(), "  " + doc.replace(" ", "\n", 3), document(2, 40)])
    assert out == [doc, document(2, 40)]
    assert stats.dropped["exact_dup"] == 2


def test_near_duplicate_is_dropped_unrelated_document_kept():
    doc = document(3)
    words = doc.split()
    words[120] = "replaced"
    out, stats = run([doc, " ".join(words), document(4)])
    assert out == [doc, document(4)]
    assert stats.dropped["near_dup"] == 1


EVAL = ["it 's a charming and often affecting journey that never lets up .", "great movie ."]


def test_contaminated_document_is_dropped():
    index = build_contamination_index(EVAL, CFG)
    assert (index.indexed, index.skipped) == (1, 1)
    embeds = f"{document(5, 30)} It's a charming -- and often AFFECTING journey; that never lets up! {document(6, 30)}"
    shares_words = f"{document(7, 30)} a charming and often affecting {document(8, 30)}"
    out, stats = run([embeds, shares_words], contamination=index)
    assert out == [shares_words]
    assert stats.dropped["contaminated"] == 1
    assert run([embeds], replace(CFG, decontaminate=DecontaminateConfig(enabled=False)), index)[0] == [embeds]


def test_stats_are_exact_on_a_small_corpus():
    kept = document(10, 30)
    near = document(11)
    corpus = [
        f"{kept}<br /><br />end",  # kept: strip_html + collapse_whitespace
        "short",  # too_short
        f"{document(12, 30)} \ufffd",  # undecodable
        " ".join(["1234 5678 90"] * 10),  # junk
        document(13, 1000),  # too_long
        f"{kept.upper()}<br /><br />END",  # exact_dup after cleaning: strip_html + collapse_whitespace
        f"{document(14, 30)} it's a charming and often affecting journey that never lets up",  # contaminated
        near,  # kept
        near.replace(near.split()[50], "changed", 1),  # near_dup
    ]
    out, stats = run(corpus, contamination=build_contamination_index(EVAL, CFG))
    assert out == [f"{kept} end", near]
    assert stats.as_dict() == {
        "docs_in": 9, "docs_out": 2,
        "chars_in": sum(map(len, corpus)), "chars_out": len(kept) + 4 + len(near),
        "rewritten": {"unicode_nfkc": 0, "strip_html": 2, "remove_control_chars": 0, "collapse_whitespace": 2},
        "dropped": {"undecodable": 1, "too_short": 1, "too_long": 1, "junk": 1, "contaminated": 1,
                    "exact_dup": 1, "near_dup": 1},
    }


def test_output_keeps_input_order():
    docs = [document(seed, 40) for seed in range(20)]
    assert run(docs)[0] == docs


def test_dedup_state_persists_across_runs():
    cleaner = DocumentCleaner(CFG, None, seed=0)
    validation = [document(20), document(21)]
    assert run(validation, cleaner=cleaner)[0] == validation
    out, stats = run([document(21).upper(), document(22), document(20)], cleaner=cleaner)
    assert out == [document(22)]
    assert stats.dropped["exact_dup"] == 2


def test_two_workers_give_the_same_output_and_stats_as_one():
    docs = [document(seed % 30, 60) for seed in range(45)] + ["tiny", "<p>" + document(99, 60) + "</p>"]
    one = run(docs, CFG)
    two = run(docs, replace(CFG, workers=2, batch_docs=3))
    assert two[0] == one[0] and two[1] == one[1]
    assert one[1].dropped["exact_dup"] == 15


@pytest.mark.parametrize("workers", [1, 2])
def test_input_is_read_lazily_with_bounded_batches_in_flight(workers):
    consumed = 0

    def docs():
        nonlocal consumed
        for seed in range(1000):
            consumed += 1
            yield document(seed, 40)

    cfg = replace(CFG, workers=workers, batch_docs=2)
    output = DocumentCleaner(cfg, None, seed=0).run(docs(), CleanStats())
    assert next(output) == document(0, 40)
    in_flight = 1 if workers == 1 else 2 * workers  # batches read before the first result is used
    assert consumed <= in_flight * cfg.batch_docs
    output.close()  # the consumer stops early: the pool must go away
    assert multiprocessing.active_children() == []


def test_the_documents_clean_will_read_are_its_splits_rows_capped_by_max_docs():
    rows = {"train": 900, "unsup": 300, "test": 50}
    assert planned_docs(CorpusConfig("data/raw/imdb", splits=["train", "unsup"]), rows) == 1200
    assert planned_docs(CorpusConfig("data/raw/imdb", splits=["train", "unsup"], valid_split="test", max_docs=400),
                        rows) == 400 + 300 + 50
