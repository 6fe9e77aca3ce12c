"""Scoring generated text (the seq2seq task type), each benchmark the way its papers score it, so that
results compare with published ones:
- translation (Multi30k en-de, en-fr): `bleu` and `chrf`, sacreBLEU's corpus scores, each with the signature
  that says how it was computed;
- summarization (SAMSum): `rouge`, ROUGE-1, ROUGE-2, ROUGE-L and ROUGE-Lsum as google-research's rouge-score;
- generative QA (SQuAD): `answer_scores`, exact match and token F1 as the extractive task's squad_scores.
`generation_scores` computes the ones asked by name (GENERATION_METRICS).

And the floors a seq2seq model reads against, which need no training: `copy_source` (translation) and `lead`
(summarization). They live here, not in baselines.py, beside the sentence splitter they share with
ROUGE-Lsum: baselines.py is a code dep of every stage from `data` on, and importing this module there would
make sacreBLEU and rouge-score a part of each.

Scales: `bleu` and `chrf` return sacreBLEU's 0-100, the numbers it prints beside its signature;
`generation_scores` gives every score as a fraction 0-1, like every score in scores.py, so that the
report, which prints every metric times 100, shows sacreBLEU's number (and ROUGE as its papers print it).
"""
from __future__ import annotations

import re
from typing import Sequence


from lib.metrics.scores import squad_scores

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")
ANSWER_METRICS = ("exact_match", "f1")
GENERATION_METRICS = ("bleu", "chrf", *ROUGE_TYPES, *ANSWER_METRICS)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")  # the space after a sentence's end punctuation


def bleu(hypotheses: list[str], references: list[str]) -> tuple[float, str]:
    """Corpus BLEU, 0-100, and its signature, as sacreBLEU's defaults compute it: detokenized text split by
    its 13a tokenizer (the WMT mteval script's), case kept, one reference per hypothesis, up to 4-grams,
    exponential smoothing. Corpus-level, as MT papers report it: the n-gram matches and the lengths are summed
    over all sentences before the precisions and the brevity penalty are taken, so it is not the mean of
    sentence BLEUs (where a short sentence weighs as much as a long one and a zero 4-gram precision, common in
    one sentence, sinks it). The signature ("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:...") goes
    beside the score so that it reads as comparable, or not, with a published one."""
    _check_pairs(hypotheses, references)
    from sacrebleu.metrics import BLEU  # here: every stage imports the task types, few score text
    metric = BLEU()
    return metric.corpus_score(hypotheses, [references]).score, str(metric.get_signature())


def chrf(hypotheses: list[str], references: list[str]) -> tuple[float, str]:
    """sacreBLEU's corpus chrF, 0-100, and its signature, at its defaults (chrF2): the F-score with beta 2
    (recall weighted twice) of character n-grams of orders 1 to 6, spaces removed, no word n-grams, case
    kept, statistics summed over the corpus as BLEU's. Less brittle than BLEU on morphology (German's
    inflections, French's agreement): a word with the right stem and the wrong ending still earns most of
    its character n-grams."""
    _check_pairs(hypotheses, references)
    from sacrebleu.metrics import CHRF
    metric = CHRF()
    return metric.corpus_score(hypotheses, [references]).score, str(metric.get_signature())


def rouge(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    """{"rouge1", "rouge2", "rougeL", "rougeLsum"}: F-measures, 0-1, each the mean over examples of
    rouge-score's per-example F-measure, as summarization papers average. No bootstrap: rouge-score's
    BootstrapAggregator (which HF evaluate uses) reports the median of resampled means, random and within
    noise of this mean, which is exact and the same on every run.

    Tokens as rouge-score makes them: lowercased, runs of a-z and 0-9 (anything else separates tokens, so
    this is for English text: "ü" would split a German word), words of more than 3 letters Porter-stemmed
    (use_stemmer=True: "running" and "runs" both count as "run").
    rougeL is the longest common subsequence (LCS) of the two whole texts; rougeLsum is Lin (2004)'s
    summary-level LCS, each reference sentence's union LCS with all the hypothesis's sentences, which is
    what BART and PEGASUS report as ROUGE-L on summarization. Sentences are `sentences`' on both sides:
    rouge-score only splits on newlines, and a model writes its summary on one line."""
    _check_pairs(hypotheses, references)
    from rouge_score.rouge_scorer import RougeScorer  # nltk's stemmer: over a second to import
    scorer = RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    totals = dict.fromkeys(ROUGE_TYPES, 0.0)
    for hypothesis, reference in zip(hypotheses, references):
        # the reference first (rouge-score's target): else precision and recall swap, and rougeLsum's union
        # LCS would run over the hypothesis's sentences
        scores = scorer.score("\n".join(sentences(reference)), "\n".join(sentences(hypothesis)))
        for name in ROUGE_TYPES:
            totals[name] += scores[name].fmeasure
    return {name: total / len(hypotheses) for name, total in totals.items()}


def sentences(text: str) -> list[str]:
    """The sentences of `text`, for ROUGE-Lsum (and the lead baseline): its non-empty lines, each split
    after a ".", "!" or "?" followed by whitespace. Lines first, so that a text already one sentence a line
    (CNN/DailyMail's references) stays so; the punctuation for one-line texts (a model's output, SAMSum's
    summaries). It stands in for nltk's punkt, which transformers' summarization example uses and which
    needs a model downloaded; unlike punkt it also splits after an abbreviation ("Dr. Smith")."""
    return [sentence for line in text.splitlines() for sentence in _SENTENCE_END.split(line.strip()) if sentence]


def answer_scores(hypotheses: list[str], golds: list[list[str]]) -> dict[str, float]:
    """{"exact_match", "f1"}, 0-1: each generated answer against its best gold answer (the maximum over
    golds), averaged over questions, by the extractive task's squad_scores, so that a generated answer and an
    extracted span are scored the same way: SQuAD's normalization (lowercase; punctuation and a/an/the
    dropped), token F1 over the normalized words; a question with no gold answer (SQuAD 2.0's, []) is
    answered right only by ""."""
    _check_pairs(hypotheses, golds)
    ids = [str(i) for i in range(len(hypotheses))]
    scores = squad_scores(dict(zip(ids, hypotheses)), dict(zip(ids, golds)))
    return {name: scores[name] for name in ANSWER_METRICS}


def generation_scores(names: Sequence[str], hypotheses: list[str],
                      references: list[str] | list[list[str]]) -> tuple[dict[str, float], dict[str, str]]:
    """({name: score as a fraction 0-1} for each of `names`, of GENERATION_METRICS; {"bleu" / "chrf":
    signature} for those asked). A reference is one text or a list of them (a question's gold answers); exact_match and f1 take
    the best of a list, the others score one reference per hypothesis. A ValueError when a name is unknown, there
    are no hypotheses, or the references are not one entry per hypothesis."""
    unknown = [name for name in names if name not in GENERATION_METRICS]
    if unknown:
        raise ValueError(f"unknown metric '{unknown[0]}'; known: {', '.join(GENERATION_METRICS)}")
    golds = [[reference] if isinstance(reference, str) else list(reference) for reference in references]
    _check_pairs(hypotheses, golds)
    wanted = set(names)
    scores: dict[str, float] = {}
    signatures: dict[str, str] = {}
    if wanted & set(ANSWER_METRICS):
        scores.update(answer_scores(hypotheses, golds))
    if wanted - set(ANSWER_METRICS):
        single = _one_reference_each(golds)
        for name, metric in (("bleu", bleu), ("chrf", chrf)):
            if name in wanted:
                score, signatures[name] = metric(hypotheses, single)
                scores[name] = score / 100  # a fraction, as every other score
        if wanted & set(ROUGE_TYPES):
            scores.update(rouge(hypotheses, single))
    return {name: scores[name] for name in names}, signatures


# baselines ------------------------------------------------------------------------------------------

def copy_source(sources: Sequence[str]) -> list[str]:
    """Translation's floor: each source sentence as its own translation. It scores what names, numbers,
    punctuation and words the two languages share give for free; a model below it has learned nothing of
    the target language."""
    return list(sources)


def lead(documents: Sequence[str], n: int = 3) -> list[str]:
    """Summarization's floor, lead-n (lead-3 in See et al. 2017 and the SAMSum paper): the first `n`
    sentences of each document, one a line (ROUGE-Lsum's sentences). A document of several lines is read a
    line per sentence: a SAMSum dialogue's lines are its turns ("Amanda: I baked cookies. Do you want
    some?"), and its lead-3 is the first three turns whole, the speakers' names kept, since the reference
    summaries name the speakers. A one-line document is split by `sentences`."""
    summaries = []
    for document in documents:
        lines = [line.strip() for line in document.splitlines() if line.strip()]
        units = lines if len(lines) > 1 else sentences(document)
        summaries.append("\n".join(units[:n]))
    return summaries


# checks ---------------------------------------------------------------------------------------------

def _one_reference_each(golds: list[list[str]]) -> list[str]:
    # Multi30k and SAMSum have one reference each; more would need a rule (ROUGE's best of them or their mean)
    # that no benchmark here asks for
    for i, references in enumerate(golds):
        if len(references) != 1:
            raise ValueError(f"bleu, chrf and ROUGE take one reference per hypothesis; example {i} has "
                             f"{len(references)}")
    return [references[0] for references in golds]


def _check_pairs(hypotheses: Sequence, references: Sequence) -> None:
    if not hypotheses:
        raise ValueError("no hypotheses to score")
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
