"""Pretraining throughput: our objectives against Hugging Face `transformers` at the same shapes.

    python bench/pretrain_throughput.py [--shape all|bert-base|gpt2-small|tiny|t5-small|bart-base|t5-tiny|bart-tiny]
        [--batch N] [--precision auto|bf16|fp32] [--no-compile] [--warmup N] [--steps N]

For each shape it times a full train step (forward, backward, AdamW step, zero_grad) of
  1. ours: lib.objectives' MaskedLM (bert-base, tiny), CausalLM (gpt2-small), SpanCorruption (t5-*) or
     Denoising (bart-*), eager;
  2. ours under torch.compile (the whole objective module, as the trainer compiles it);
  3. HF BertForMaskedLM / GPT2LMHeadModel / T5ForConditionalGeneration / BartForConditionalGeneration with
     the same config (vocab, layers, width, heads, FFN, max positions, dropout 0.1, our activation, tied
     embeddings, attn_implementation="sdpa" where the family has it), eager;
  4. the HF model under torch.compile.
Every model trains on one fixed batch of random tokens (seed fixed) under bf16 autocast or in fp32
(--precision auto, the default, resolves as the stages do: bf16 on CUDA, on CPU only where lib.core.runtime's
probe found bf16 matmuls faster), with AdamW over the trainer's parameter groups (fused on CUDA). After the warmup steps (which include
compilation) the timed steps give tokens/s = batch x seq_len x steps / seconds; on CUDA the clock is
read after torch.cuda.synchronize(). MFU = Transformer.flops_per_token x tokens/s / the GPU's dense
bf16 peak, with our formula for every row since the architectures match.

What is fair and what is not:
- Same architecture and parameter count: BERT rows are post-LN with segment embeddings, GPT-2 rows
  pre-LN without. Ours has a few more parameters at the GPT-2 shape (an embedding LayerNorm and BERT's
  dense+LayerNorm prediction head, ~0.5%); both counts are printed. Ours also stores its embedding
  table padded to a multiple of 64 rows (50304 for GPT-2's 50257), as our models always do (lib/models/config.py): the
  logits of the padding are sliced off, so it computes the same function. MFU counts the real vocabulary.
- MLM: ours masks inside the timed step (new masks every step, as in training) and computes the
  vocabulary logits at the ~15% selected positions only. HF is given inputs masked once beforehand
  with the same 15% rate and 80/10/10 corruption (labels -100 elsewhere), as a data collator would do
  outside the step, and computes logits at every position: its normal behaviour, and the main
  reason ours is faster at the BERT shape. For the same reason MFU (which counts the full-vocab head
  at every position) overstates how busy the GPU is for our MLM rows; read it as tokens/s in common units.
- Ours also computes its accuracy metric (an argmax over its logits) in the step, as in training.
  Compiled, our MLM breaks the graph at the masked gather (a data-dependent shape) and recompiles once
  with a dynamic size on its third step, so keep at least 3 warmup steps.
- CLM: both compute logits at every position. HF's loss covers seq_len - 1 targets (it shifts the
  labels inside the window), ours seq_len (it reads windows of seq_len + 1 tokens).
- T5 and BART: as with MLM, ours corrupts inside the timed step (span corruption, BART's noising: Python on
  the CPU, as in training) and HF is given the batch corrupted once beforehand by the same functions
  (lib/objectives/noising.py), so both run the same source and target lengths. tokens/s counts the
  window's tokens (batch x seq_len) for both; the FLOPs behind MFU are the encoder's on the source and
  the decoder's on the target (EncoderDecoder.flops_per_sequence). Ours reads the sentinels and sentence
  ends a tokenizer would give from fixed tables (the last 100 ids; every 16th id ends a sentence).
- No gradient clipping, no data loading, no .item() per step: the step itself, nothing around it.
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path

import torch
import transformers
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere

from lib.config.params import (Corpora, CorpusConfig, DenoisingConfig, MLMConfig, ModelConfig, Params,  # noqa: E402
                               SpanCorruptionConfig, TrainConfig)
from lib.core import runtime  # noqa: E402
from lib.core.errors import one_line, run_main  # noqa: E402
from lib.data.windows import TaggedWindows  # noqa: E402
from lib.models.architectures import build_model  # noqa: E402
from lib.models.architectures.encoder_decoder import seq2seq_config  # noqa: E402
from lib.models.config import TransformerConfig  # noqa: E402
from lib.objectives import build_objective  # noqa: E402
from lib.objectives.masking import mask_tokens  # noqa: E402
from lib.objectives.bart import Denoising  # noqa: E402
from lib.objectives.noising import Noised, denoise, span_corruption  # noqa: E402
from lib.objectives.t5 import SpanCorruption  # noqa: E402
from lib.training.budget_loop import PEAK_BF16_FLOPS  # noqa: E402
from lib.training.optim import build_optimizer  # noqa: E402

T5, BART = SpanCorruption.name, Denoising.name  # the encoder-decoder objectives (the families share the names)
SPECIAL = {"pad": 0, "unk": 1, "bos": 2, "eos": 3, "mask": 4}  # random tokens are drawn above these
Batch = tuple[torch.Tensor, torch.Tensor]
LossFn = Callable[[nn.Module], torch.Tensor]  # (the module or its compiled wrapper) -> loss of the batch


@dataclass(frozen=True)
class Shape:
    objective: str  # mlm (BERT-like, post-LN) | clm (GPT-2-like, pre-LN) | t5 | bart (encoder-decoders)
    vocab: int
    layers: int
    d_model: int
    heads: int
    d_ff: int
    max_positions: int
    seq_len: int
    batch: int


SHAPES = {
    "bert-base": Shape("mlm", 30522, 12, 768, 12, 3072, 512, 128, 256),
    "gpt2-small": Shape("clm", 50257, 12, 768, 12, 3072, 1024, 1024, 32),
    "tiny": Shape("mlm", 16384, 4, 256, 4, 1024, 512, 128, 16),
    "t5-small": Shape(T5, 32128, 6, 512, 8, 2048, 512, 512, 64),
    "bart-base": Shape(BART, 50265, 6, 768, 12, 3072, 1024, 512, 32),
    "t5-tiny": Shape(T5, 16384, 4, 256, 4, 1024, 512, 128, 16),
    "bart-tiny": Shape(BART, 16384, 4, 256, 4, 1024, 512, 128, 16),
}
SENTINELS = 100  # T5's: the last ids of the vocabulary
ENCODER_DECODERS = (T5, BART)


def model_config(shape: Shape) -> ModelConfig:
    bert = shape.objective == "mlm"
    return ModelConfig(d_model=shape.d_model, n_layers=shape.layers, n_heads=shape.heads, d_ff=shape.d_ff,
                       dropout=0.1, max_positions=shape.max_positions, position="learned",
                       norm="post" if bert else "pre", tie_embeddings=True, segment_vocab=2 if bert else 0)


def random_batch(shape: Shape, device: torch.device, seed: int) -> Batch:
    """(batch, seq_len + 1) random non-special tokens, every token a word start."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(len(SPECIAL), shape.vocab, (shape.batch, shape.seq_len + 1), generator=g).to(device)
    return tokens, torch.ones_like(tokens, dtype=torch.bool)


def sentinels(shape: Shape) -> torch.Tensor:
    return torch.arange(shape.vocab - 1, shape.vocab - 1 - SENTINELS, -1)


def sentence_ends(shape: Shape) -> torch.Tensor:
    return torch.arange(shape.vocab) % 16 == 15


def build_ours(shape: Shape, batch: Batch) -> tuple[nn.Module, LossFn]:
    corpus = CorpusConfig(source="unused")  # the objectives read only the model and their own sections
    params = Params(corpora=Corpora(pretrain=corpus, domain=corpus), tasks={}, model=model_config(shape))
    objective = build_objective(shape.objective, params, shape.vocab, SPECIAL)
    if shape.objective == T5:  # what batches() reads from the tokenizer
        objective.sentinel_ids = sentinels(shape)
    elif shape.objective == BART:
        objective.sentence_ends = sentence_ends(shape)
    windows = TaggedWindows(*batch)
    return objective, lambda forward: forward(windows)[0]


def corrupted(shape: Shape, batch: Batch) -> Noised:
    """The batch's windows as the encoder-decoder objective corrupts them (on the CPU), on the batch's device."""
    tokens, word_starts = (t[:, :-1].cpu() for t in batch)
    if shape.objective == T5:
        noised = span_corruption(tokens, sentinels(shape), SPECIAL["eos"], SPECIAL["pad"], SPECIAL["pad"],
                                 SpanCorruptionConfig())
    else:
        noised = denoise(tokens, word_starts, sentence_ends(shape), SPECIAL, shape.vocab, SPECIAL["eos"],
                         DenoisingConfig())
    return Noised(*(getattr(noised, f.name).to(batch[0].device) for f in fields(noised)))


def build_hf_seq2seq(shape: Shape, batch: Batch) -> tuple[nn.Module, LossFn]:
    noised = corrupted(shape, batch)
    ids = dict(pad_token_id=SPECIAL["pad"], eos_token_id=SPECIAL["eos"], tie_word_embeddings=True)
    if shape.objective == T5:
        config = transformers.T5Config(
            vocab_size=shape.vocab, d_model=shape.d_model, d_kv=shape.d_model // shape.heads, d_ff=shape.d_ff,
            num_layers=shape.layers, num_decoder_layers=shape.layers, num_heads=shape.heads, dropout_rate=0.1,
            feed_forward_proj="relu", decoder_start_token_id=SPECIAL["pad"], **ids)
        model = transformers.T5ForConditionalGeneration(config)
    else:
        config = transformers.BartConfig(
            vocab_size=shape.vocab, d_model=shape.d_model, encoder_layers=shape.layers, decoder_layers=shape.layers,
            encoder_attention_heads=shape.heads, decoder_attention_heads=shape.heads, encoder_ffn_dim=shape.d_ff,
            decoder_ffn_dim=shape.d_ff, activation_function="gelu", dropout=0.1, attention_dropout=0.1,
            max_position_embeddings=shape.max_positions, bos_token_id=SPECIAL["bos"],
            decoder_start_token_id=SPECIAL["eos"], forced_eos_token_id=None, attn_implementation="sdpa", **ids)
        model = transformers.BartForConditionalGeneration(config)
    # labels -100 at the targets' padding; the model shifts them right into its decoder's inputs
    return model, lambda forward: forward(input_ids=noised.inputs, attention_mask=noised.input_mask,
                                          labels=noised.targets).loss


def build_hf(shape: Shape, batch: Batch) -> tuple[nn.Module, LossFn]:
    tokens, word_starts = batch
    if shape.objective in ENCODER_DECODERS:
        return build_hf_seq2seq(shape, batch)
    if shape.objective == "mlm":
        config = transformers.BertConfig(
            vocab_size=shape.vocab, hidden_size=shape.d_model, num_hidden_layers=shape.layers,
            num_attention_heads=shape.heads, intermediate_size=shape.d_ff, hidden_act="gelu",
            hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, max_position_embeddings=shape.max_positions,
            type_vocab_size=2, tie_word_embeddings=True, attn_implementation="sdpa")
        model = transformers.BertForMaskedLM(config)
        masked = mask_tokens(tokens[:, :-1], word_starts[:, :-1], SPECIAL, shape.vocab, MLMConfig())
        inputs, labels = masked.inputs, masked.labels  # labels -100 outside the ~15% selected positions
    else:
        config = transformers.GPT2Config(
            vocab_size=shape.vocab, n_positions=shape.max_positions, n_embd=shape.d_model, n_layer=shape.layers,
            n_head=shape.heads, n_inner=shape.d_ff, activation_function="gelu",  # ours is exact GELU too
            resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, tie_word_embeddings=True, attn_implementation="sdpa")
        model = transformers.GPT2LMHeadModel(config)
        inputs = labels = tokens[:, :-1]  # the model shifts the labels itself
    return model, lambda forward: forward(input_ids=inputs, labels=labels).loss


def time_steps(forward: nn.Module, loss_fn: LossFn, optimizer: torch.optim.Optimizer, precision: runtime.Precision,
               device: torch.device, warmup: int, steps: int) -> tuple[float, float]:
    """Seconds of the warmup steps and of the timed steps that follow."""
    def step() -> None:
        with runtime.autocast(device, precision):
            loss = loss_fn(forward)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    start = time.perf_counter()
    for _ in range(warmup):
        step()
    sync()
    timed = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return timed - start, time.perf_counter() - timed


def measure(build: Callable, shape: Shape, compiled: bool, args: argparse.Namespace,
            device: torch.device) -> dict[str, float]:
    torch.manual_seed(args.seed)  # same weights and masks for the eager and compiled runs
    batch = random_batch(shape, device, args.seed)
    module, loss_fn = build(shape, batch)
    module.to(device).train()
    cfg = TrainConfig()
    optimizer = build_optimizer(module, cfg, device, cfg.lr)
    forward = torch.compile(module) if compiled else module
    warmup_s, seconds = time_steps(forward, loss_fn, optimizer, args.precision, device, args.warmup, args.steps)
    return {"params": sum(p.numel() for p in module.parameters()), "warmup_s": warmup_s,
            "tokens_per_s": shape.batch * shape.seq_len * args.steps / seconds}


def free_memory(device: torch.device) -> None:
    gc.collect()
    torch._dynamo.reset()  # compiled graphs hold on to their modules
    if device.type == "cuda":
        torch.cuda.empty_cache()


def flops_per_token(shape: Shape, seed: int) -> float:
    if shape.objective in ENCODER_DECODERS:
        noised = corrupted(shape, random_batch(shape, torch.device("cpu"), seed))
        cfg = seq2seq_config(model_config(shape), shape.objective, None, shape.vocab, SPECIAL)
        with torch.device("meta"):  # the count only reads weight shapes: no memory, no init time
            model = build_model(cfg)
        return model.flops_per_sequence(noised.inputs.shape[1], noised.targets.shape[1]) / shape.seq_len
    cfg = TransformerConfig.from_params(model_config(shape), shape.vocab, causal=shape.objective == "clm")
    with torch.device("meta"):  # flops_per_token only counts weights: no memory, no init time
        return build_model(cfg).flops_per_token(shape.seq_len)


def bench_shape(name: str, shape: Shape, args: argparse.Namespace, device: torch.device,
                peak: float | None) -> list[str]:
    """Markdown table rows of the four (or, with --no-compile, two) runs at one shape."""
    hf_name = "HF " + {"mlm": "BertForMaskedLM", "clm": "GPT2LMHeadModel", T5: "T5ForConditionalGeneration",
                       BART: "BartForConditionalGeneration"}[shape.objective]
    runs = [(f"ours {shape.objective.upper()}", build_ours, False), (hf_name, build_hf, False)]
    if args.compile:
        runs += [(label, build, True) for label, build, _ in runs]
    results = {}
    for label, build, compiled in runs:
        print(f"{name}: {label}{' compiled' if compiled else ''} ...", file=sys.stderr, flush=True)
        try:
            results[label, compiled] = measure(build, shape, compiled, args, device)
            print(f"  {results[label, compiled]['tokens_per_s']:,.0f} tokens/s", file=sys.stderr, flush=True)
        except Exception as err:  # OOM, a compile failure: report this run and go on with the others
            results[label, compiled] = {"error": one_line(err)}
            print(f"  failed: {results[label, compiled]['error']}", file=sys.stderr, flush=True)
        free_memory(device)

    fpt = flops_per_token(shape, args.seed)
    baselines = [results.get((hf_name, compiled), {}).get("tokens_per_s") for compiled in (False, True)]
    rows = []
    for label, _, compiled in sorted(runs, key=lambda run: (run[1] is build_hf, run[2])):
        r = results[label, compiled]
        head = f"| {name} | {label} | {'yes' if compiled else 'no'} |"
        if "error" in r:
            rows.append(f"{head} failed: {r['error']} |" + " |" * 6)
            continue
        tps = r["tokens_per_s"]
        mfu = f"{fpt * tps / peak:.1%}" if peak else "-"
        ratios = [f"{tps / base:.2f}x" if base else "-" for base in baselines]
        rows.append(f"{head} {r['params'] / 1e6:.2f}M | {shape.batch}x{shape.seq_len} | {r['warmup_s']:.1f} | "
                    f"{tps:,.0f} | {mfu} | {' | '.join(ratios)} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=[*SHAPES, "all"], default="all",
                        help="all = bert-base, gpt2-small, t5-small and bart-base on CUDA; the tiny ones on CPU")
    parser.add_argument("--batch", type=int, help="sequences per step (default: the shape's)")
    parser.add_argument("--precision", choices=runtime.PRECISIONS, default="auto",
                        help="bf16 = bf16 autocast; auto = bf16 on CUDA, on CPU where it is faster (lib/core/runtime.py)")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="eager runs only")
    parser.add_argument("--warmup", type=int,
                        help="untimed steps first, compilation included (default 10 on CUDA, 3 on CPU)")
    parser.add_argument("--steps", type=int, help="timed steps (default 30 on CUDA, 5 on CPU)")
    parser.add_argument("--seed", type=int, default=1337)
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.type == "cuda"
    args.precision = runtime.resolve_precision(args.precision, device, key="--precision")
    args.warmup = args.warmup if args.warmup is not None else (10 if cuda else 3)
    args.steps = args.steps or (30 if cuda else 5)
    if args.shape == "all":
        names = ["bert-base", "gpt2-small", "t5-small", "bart-base"] if cuda else ["tiny", "t5-tiny", "bart-tiny"]
    else:
        names = [args.shape]
    shapes = {name: replace(SHAPES[name], batch=args.batch or SHAPES[name].batch) for name in names}
    device_name = torch.cuda.get_device_name(device) if cuda else f"CPU, {torch.get_num_threads()} threads"
    peak = next((v for k, v in PEAK_BF16_FLOPS.items() if k in device_name), None) if cuda else None
    print(f"{device_name}; torch {torch.__version__}, transformers {transformers.__version__}; "
          f"{args.precision}; {args.warmup} warmup + {args.steps} timed steps; peak bf16 "
          f"{f'{peak / 1e12:.0f} TFLOP/s' if peak else 'unknown (no MFU)'}\n")

    rows = [row for name, shape in shapes.items() for row in bench_shape(name, shape, args, device, peak)]
    columns = ["shape", "model", "compiled", "params", "batch x seq", "warmup s", "tokens/s", "MFU", "vs HF eager",
               "vs HF compiled"]
    print(f"| {' | '.join(columns)} |\n|{'---|' * len(columns)}")
    print("\n".join(rows))


if __name__ == "__main__":
    run_main(main)
