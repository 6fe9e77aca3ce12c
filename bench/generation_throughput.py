"""Generation throughput: lib.models.generation.generate against transformers' `generate` on the same model.

    python bench/generation_throughput.py [--shape all|t5-small|bart-small] [--batch N] [--source-len N]
        [--max-new-tokens N] [--beams N] [--dtype fp32|bf16|fp16] [--threads N] [--warmup N] [--repeats N]

For each shape (4 + 4 layers, d_model 256, 4 heads, d_ff 1024, a 16384-token vocabulary) our random
encoder-decoder of T5's or BART's shape is written as its transformers folder (lib.models.folder.save_model)
and read back by AutoModelForSeq2SeqLM, so both sides hold the same weights, in the same --dtype (the weights
cast, no autocast; both take log-softmax in fp32). Both decode the same batch of random sources (all
--source-len tokens long) greedily and with --beams beams (length_penalty 1.0; transformers with
early_stopping=True, which ours follows) for --max-new-tokens after the decoder's start token. The end token
both are given is an id past the vocabulary, which neither can write, so that every call does the same work
(a random BART writes its own end token at once). transformers gets a generation config with every forcing
off (BART's forced end token, n-gram bans, minimum lengths), so that both compute the same thing. Both run
with their key/value cache, in eval mode, under inference mode.

Each side runs --warmup untimed calls, then --repeats timed ones; the fastest counts (the least disturbed by
anything else on the machine). tokens/s = the tokens a call wrote (batch x max-new-tokens) / its seconds, the
encoder's pass included. `same tokens` says whether the two wrote the same tokens: a random model's
near-equal logits can tip an argmax either way under a rounding difference, so `no` in bf16 says little; in
fp32 it should read `yes`. On CUDA the clock is read after torch.cuda.synchronize().
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere

from lib.config.params import ModelConfig  # noqa: E402
from lib.core import runtime  # noqa: E402
from lib.core.errors import UserError, run_main  # noqa: E402
from lib.models.architectures import build_model  # noqa: E402
from lib.models.architectures.encoder_decoder import SHAPES, EncoderDecoder, seq2seq_config  # noqa: E402
from lib.models.folder import save_model  # noqa: E402
from lib.models.generation import Decoding, generate, until  # noqa: E402

T5, BART = SHAPES
SPECIAL = {T5: {"pad": 0, "eos": 1}, BART: {"bos": 0, "pad": 1, "eos": 2}}  # as each family numbers them
SIZES = ModelConfig(d_model=256, n_layers=4, n_heads=4, d_ff=1024, dropout=0.0, max_positions=512)
VOCAB = 16384
BENCH_SHAPES = {f"{T5}-small": T5, f"{BART}-small": BART}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def models(shape: str, dtype: torch.dtype, device: torch.device, seed: int) -> tuple[EncoderDecoder, torch.nn.Module]:
    """Ours and transformers' reading of its folder, in eval mode on `device` in `dtype`."""
    torch.manual_seed(seed)
    ours = build_model(seq2seq_config(SIZES, shape, SIZES.n_layers, VOCAB, SPECIAL[shape]))
    with tempfile.TemporaryDirectory(prefix="generation-bench-") as folder:
        save_model(ours, folder, SPECIAL[shape])
        theirs = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder, dtype=dtype)
    return ours.to(device, dtype).eval(), theirs.to(device).eval()


def their_config(ours: EncoderDecoder, shape: str, decoding: Decoding, eos: int) -> transformers.GenerationConfig:
    """transformers' generation config for `decoding`, with every forcing off: set in full, since generate()
    fills what it leaves unset from the model's own (BART's forced end token, for one)."""
    beams = {} if decoding.num_beams == 1 else dict(length_penalty=decoding.length_penalty, early_stopping=True)
    return transformers.GenerationConfig(
        do_sample=False, num_beams=decoding.num_beams, max_new_tokens=decoding.max_new_tokens, **beams,
        min_length=0, min_new_tokens=None, no_repeat_ngram_size=0, repetition_penalty=1.0, forced_bos_token_id=None,
        forced_eos_token_id=None, bad_words_ids=None, suppress_tokens=None, begin_suppress_tokens=None,
        eos_token_id=eos, pad_token_id=SPECIAL[shape]["pad"],
        decoder_start_token_id=ours.cfg.decoder_start, use_cache=True)


def fastest(run: Callable[[], list[list[int]]], device: torch.device, warmup: int,
            repeats: int) -> tuple[float, list[list[int]]]:
    """The fastest of `repeats` timed calls after `warmup` untimed ones, and what the last call wrote."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        run()
    best = float("inf")
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        tokens = run()
        sync()
        best = min(best, time.perf_counter() - start)
    return best, tokens


def bench_shape(name: str, args: argparse.Namespace, device: torch.device) -> list[str]:
    """One table row per decoding at one shape."""
    shape = BENCH_SHAPES[name]
    ours, theirs = models(shape, DTYPES[args.dtype], device, args.seed)
    eos = VOCAB  # never written: see the module docstring
    first_word = max(SPECIAL[shape].values()) + 1
    generator = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(first_word, VOCAB, (args.batch, args.source_len), generator=generator).to(device)
    mask = torch.ones_like(ids)
    rows = []
    for label, decoding in (("greedy", Decoding(1, 1.0, args.max_new_tokens)),
                            (f"beams {args.beams}", Decoding(args.beams, 1.0, args.max_new_tokens))):
        config = their_config(ours, shape, decoding, eos)

        def hf() -> list[list[int]]:
            with torch.inference_mode():
                written = theirs.generate(ids, attention_mask=mask, generation_config=config)
            return [until(row, eos) for row in written[:, 1:].tolist()]

        print(f"{name}: {label} ...", file=sys.stderr, flush=True)
        mine_s, mine = fastest(lambda: generate(ours, ids, mask, decoding, eos), device, args.warmup, args.repeats)
        hf_s, expected = fastest(hf, device, args.warmup, args.repeats)
        mine_tps, hf_tps = sum(map(len, mine)) / mine_s, sum(map(len, expected)) / hf_s
        rows.append(f"| {name} | {label} | {mine_tps:,.0f} | {hf_tps:,.0f} | {mine_tps / hf_tps:.2f}x | "
                    f"{'yes' if mine == expected else 'no'} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=[*BENCH_SHAPES, "all"], default="all")
    parser.add_argument("--batch", type=int, default=16, help="sources per call")
    parser.add_argument("--source-len", type=int, default=32, help="tokens per source")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--beams", type=int, default=4, help="beams of the beam-search rows")
    parser.add_argument("--dtype", choices=DTYPES, default="fp32", help="both models' weights")
    parser.add_argument("--threads", type=int, default=0, help="torch's CPU threads; 0 = as the stages choose")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls per side and decoding")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per side and decoding; the fastest counts")
    parser.add_argument("--seed", type=int, default=1337)
    args = parser.parse_args()
    if min(args.batch, args.source_len, args.max_new_tokens, args.beams - 1, args.repeats) < 1 or args.warmup < 0:
        raise UserError("--batch, --source-len, --max-new-tokens and --repeats must be >= 1, --beams >= 2, "
                        "--warmup >= 0")

    device = runtime.resolve_device("auto")
    torch.set_num_threads(runtime.cpu_threads(args.threads))
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"{where}; torch {torch.__version__}, transformers {transformers.__version__}; {args.dtype}; "
          f"{args.batch} sources x {args.source_len} tokens, up to {args.max_new_tokens} new tokens; "
          f"fastest of {args.repeats} after {args.warmup} warmup", flush=True)
    columns = ["shape", "decoding", "ours tokens/s", "HF tokens/s", "ours / HF", "same tokens"]
    print(f"| {' | '.join(columns)} |\n|{'---|' * len(columns)}", flush=True)
    for name in BENCH_SHAPES if args.shape == "all" else [args.shape]:
        print("\n".join(bench_shape(name, args, device)), flush=True)


if __name__ == "__main__":
    run_main(main)
