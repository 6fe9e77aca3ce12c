"""Scoring generated text: BLEU and chrF (hand-computed and against sacreBLEU's function API), ROUGE
(hand-computed LCS), exact match / F1 of generated answers, and the seq2seq baselines."""
from __future__ import annotations

import pytest
import sacrebleu

from lib.metrics.generation import (GENERATION_METRICS, answer_scores, bleu, chrf, copy_source, generation_scores,
                                    lead, rouge, sentences)

CAT = "the cat sat on the mat"
CAT_REFERENCE = "the cat sat on a mat"  # n-gram matches 5/6, 3/5, 2/4, 1/3; same length: no brevity penalty


# BLEU and chrF --------------------------------------------------------------------------------------

def test_bleu_of_identical_text_is_100_with_sacrebleus_default_signature():
    score, signature = bleu(["Ein Hund läuft.", "Zwei Katzen."], ["Ein Hund läuft.", "Zwei Katzen."])
    assert score == pytest.approx(100.0)
    assert "tok:13a" in signature and "case:mixed" in signature and "nrefs:1" in signature


def test_bleu_of_a_known_pair():
    score, _ = bleu([CAT], [CAT_REFERENCE])
    assert score == pytest.approx(100 * (5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25)
    assert score == pytest.approx(sacrebleu.corpus_bleu([CAT], [[CAT_REFERENCE]]).score)


def test_bleu_is_case_sensitive():
    assert bleu(["The cat sat on the mat"], [CAT])[0] < bleu([CAT], [CAT])[0]


def test_bleu_is_corpus_level_not_a_mean_of_sentence_bleus():
    hypotheses, references = [CAT, "hello there"], [CAT_REFERENCE, "hello world"]
    score, _ = bleu(hypotheses, references)
    # counts summed over the corpus: 6/8, 3/6, 2/4, 1/3, lengths 8 and 8
    assert score == pytest.approx(100 * (6 / 8 * 3 / 6 * 2 / 4 * 1 / 3) ** 0.25)
    assert score == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    sentence_mean = sum(sacrebleu.sentence_bleu(h, [r]).score for h, r in zip(hypotheses, references)) / 2
    assert abs(score - sentence_mean) > 1


def test_chrf_of_a_known_pair_and_identical_text():
    score, signature = chrf([CAT], [CAT_REFERENCE])
    assert score == pytest.approx(72.0848, abs=1e-4)
    assert score == pytest.approx(sacrebleu.corpus_chrf([CAT], [[CAT_REFERENCE]]).score)
    assert "nc:6" in signature and "nw:0" in signature
    assert chrf([CAT], [CAT])[0] == pytest.approx(100.0)


# ROUGE ----------------------------------------------------------------------------------------------

def test_rouge_stems_words():
    assert rouge(["running"], ["runs"])["rouge1"] == pytest.approx(1.0)
    # he, was, run against he, run: precision 2/3, recall 1 (unstemmed it would be 1/3 and 1/2)
    assert rouge(["He was running!"], ["he runs"])["rouge1"] == pytest.approx(0.8)


def test_rouge_lsum_is_summary_level_on_one_line_texts():
    reference = "The cat sat down. The dog ran off."
    hypothesis = "The dog ran off. The cat sat down."
    scores = rouge([hypothesis], [reference])
    assert scores["rouge1"] == pytest.approx(1.0)
    assert scores["rouge2"] == pytest.approx(6 / 7)  # "down the" / "off the" is the one bigram not shared
    assert scores["rougeL"] == pytest.approx(0.5)  # the whole texts' LCS: one sentence, 4 of 8 words
    assert scores["rougeLsum"] == pytest.approx(1.0)  # each reference sentence found whole in a hypothesis one
    assert rouge([hypothesis], ["The cat sat down.\nThe dog ran off."]) == pytest.approx(scores)


def test_rouge_is_the_mean_of_example_scores():
    # per example 1 and 0; pooled counts (2 shared of 3 and 4 tokens) would give 4/7
    assert rouge(["the cat", "xyz"], ["the cat", "a dog"])["rouge1"] == pytest.approx(0.5)


def test_sentences_split_lines_then_end_punctuation():
    assert sentences("Hi there! How are you?\n\nFine. 3.5 is a number.") == [
        "Hi there!", "How are you?", "Fine.", "3.5 is a number."]
    assert sentences("") == []


# generated answers ----------------------------------------------------------------------------------

def test_answer_scores_normalize_and_take_the_best_gold():
    scores = answer_scores(["The Eiffel Tower!", "in Paris, France", ""], [["Eiffel Tower"], ["Paris", "France"], []])
    # F1 "in paris france" against "paris": precision 1/3, recall 1; "" answers the unanswerable one
    assert scores == pytest.approx({"exact_match": 2 / 3, "f1": (1 + 0.5 + 1) / 3})


# generation_scores ----------------------------------------------------------------------------------

def test_generation_scores_by_name():
    scores, signatures = generation_scores(GENERATION_METRICS, [CAT], [CAT_REFERENCE])
    assert list(scores) == list(GENERATION_METRICS)
    # fractions, as every score: the report's times 100 is sacreBLEU's number
    assert scores["bleu"] == pytest.approx(bleu([CAT], [CAT_REFERENCE])[0] / 100)
    assert scores["chrf"] == pytest.approx(chrf([CAT], [CAT_REFERENCE])[0] / 100)
    assert scores["rougeL"] == pytest.approx(rouge([CAT], [CAT_REFERENCE])["rougeL"])
    assert scores["exact_match"] == 1.0  # SQuAD's normalization drops "the" and "a"
    assert set(signatures) == {"bleu", "chrf"}
    assert generation_scores(["f1"], ["Paris"], [["London", "paris"]]) == ({"f1": 1.0}, {})


def test_generation_scores_errors():
    with pytest.raises(ValueError, match="unknown metric 'meteor'"):
        generation_scores(["bleu", "meteor"], [CAT], [CAT])
    with pytest.raises(ValueError, match="no hypotheses"):
        generation_scores(["bleu"], [], [])
    with pytest.raises(ValueError, match="1 hypotheses but 2 references"):
        generation_scores(["rouge1"], [CAT], [CAT, CAT])
    with pytest.raises(ValueError, match="one reference per hypothesis; example 0 has 2"):
        generation_scores(["bleu"], [CAT], [[CAT, CAT_REFERENCE]])


# baselines ------------------------------------------------------------------------------------------

def test_lead_takes_a_dialogues_first_turns_whole():
    dialogue = ("Amanda: I baked cookies. Do you want some?\r\nJerry: Sure!\r\n"
                "Amanda: I'll bring you tomorrow :-)\r\nJerry: Thanks")
    assert lead([dialogue]) == ["Amanda: I baked cookies. Do you want some?\nJerry: Sure!\n"
                                "Amanda: I'll bring you tomorrow :-)"]
    assert lead([dialogue], n=1) == ["Amanda: I baked cookies. Do you want some?"]


def test_lead_splits_a_one_line_document_into_sentences():
    assert lead(["One fell. Two ran! Three? Four."]) == ["One fell.\nTwo ran!\nThree?"]
    assert lead(["Short."]) == ["Short."]


def test_copy_source_scores_the_source_as_its_translation():
    sources = ["A dog runs in Berlin.", "Two men."]
    assert copy_source(sources) == sources
    assert 0 < bleu(copy_source(sources), ["Ein Hund läuft in Berlin.", "Zwei Männer."])[0] < 100
