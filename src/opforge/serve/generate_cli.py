"""``opforge generate MODEL --prompt "..."``: stream text, then speed, memory and kernels (MODEL: a
Hugging Face directory or a GGUF file). Decodes with ``opforge.serve.generate`` (the engine)."""
from __future__ import annotations

import argparse
import sys
import warnings
from collections import Counter
from typing import NoReturn, Optional, Sequence

import torch

from ..models.cli_checks import GROUP_SIZES, check_length, check_numbers, check_token_ids, dense_note, read_config
from ..models.config import UnsupportedModelError
from .generate import generate, last_stats


class _UsageError(Exception):
    """A command line argparse cannot parse (raised instead of argparse's exit, to print one line)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:   # argparse prints usage and exits; say it in one line
        raise _UsageError(message)


def _fail(message: str) -> int:
    print(f"opforge generate: error: {message}", file=sys.stderr)
    return 2


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="opforge generate",
                     description="Generate text with a Llama/Mistral/Qwen2/Qwen3 checkpoint: stream the new "
                                 "tokens, then print the speed, the memory and the kernels that ran.")
    parser.add_argument("model_dir", metavar="MODEL",
                        help="a Hugging Face layout directory (config.json, *.safetensors, tokenizer.json for "
                             "--prompt) or a GGUF file (its tokenizer inside)")
    parser.add_argument("--prompt", default="",
                        help="the prompt as text (needs the `tokenizers` package and the model's tokenizer: "
                             "MODEL/tokenizer.json or the GGUF file's vocabulary)")
    parser.add_argument("--prompt-ids", metavar="IDS",
                        help="the prompt as comma-separated token ids in [0, vocab_size), instead of --prompt")
    parser.add_argument("--max-new-tokens", type=int, default=64, metavar="N",
                        help="tokens to generate, >= 1; generation also stops at the model's end-of-sequence "
                             "token (default: %(default)s)")
    parser.add_argument("--temperature", type=float, default=0.0, metavar="T",
                        help="sampling temperature, >= 0; 0 is greedy (default: %(default)s)")
    parser.add_argument("--top-k", type=int, metavar="K",
                        help="with --temperature > 0: sample among the K most likely tokens, K >= 1 (default: all)")
    parser.add_argument("--top-p", type=float, metavar="P",
                        help="with --temperature > 0: sample among the most likely tokens whose probabilities "
                             "add up to P, in (0, 1] (default: 1, all)")
    parser.add_argument("--quantize", choices=["stored", "dense", "int8", "int4"],
                        help="int8/int4: quantize the layers' projections (embedding, norms and output head stay "
                             "dense); dense: dequantize a GGUF file's quantized weights; stored: keep them as the "
                             "file stores them (default: stored, except a GGUF file on the CPU: dense, since the "
                             "CPU's torch path would dequantize quantized weights at every step)")
    parser.add_argument("--group-size", type=int, default=128, choices=GROUP_SIZES, metavar="G",
                        help="with --quantize: input channels per scale, one of 32, 64, 128, or -1 for one group "
                             "per row; a projection whose input dimension G does not divide stays dense, and "
                             "generate says so (default: %(default)s)")
    parser.add_argument("--quantize-head", action="store_true",
                        help="with --quantize, also quantize the output head (default: dense)")
    parser.add_argument("--max-seq-len", type=int, default=4096, metavar="L",
                        help="the longest prompt + new tokens accepted; the KV cache is sized for the request, "
                             "at most L (default: %(default)s)")
    parser.add_argument("--device", metavar="DEVICE",
                        help="cpu, cuda, cuda:N or mps (default: CUDA, then MPS, then CPU)")
    parser.add_argument("--no-graphs", action="store_true",
                        help="on CUDA, run the decode step eagerly instead of replaying a CUDA graph "
                             "(default: graphs on CUDA)")
    parser.add_argument("--readback", type=int, default=1, metavar="N",
                        help="accepted for existing scripts, >= 1; every value runs the same (the engine reads a "
                             "step's tokens while the next step runs) (default: %(default)s)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``opforge generate``; returns the exit status (2, with a one-line reason on stderr, for
    a bad argument: every argument is checked before the model loads).

    Example:
        >>> from opforge.serve.generate_cli import main
        >>> from opforge.models.testing import write_tiny_checkpoint
        >>> import contextlib, io
        >>> with contextlib.redirect_stdout(io.StringIO()) as printed:
        ...     status = main([write_tiny_checkpoint(), "--prompt-ids", "1,2,3", "--max-new-tokens", "3"])
        >>> status, "tokens/s" in printed.getvalue()
        (0, True)
    """
    try:
        args = _parser().parse_args(argv)
    except _UsageError as exc:
        return _fail(str(exc))
    problem = check_numbers(args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.max_seq_len,
                            args.readback)
    if problem:
        return _fail(problem)
    if not args.prompt and not args.prompt_ids:
        return _fail("give a prompt: --prompt TEXT (with the `tokenizers` package and the model's tokenizer) "
                     "or --prompt-ids 1,2,3")
    from .. import api as opforge
    try:
        device = opforge.device_config(args.device).device
    except (ValueError, RuntimeError) as exc:
        return _fail(f"--device {args.device}: {str(exc).splitlines()[0]}")
    config, problem = read_config(args.model_dir)
    if config is None:
        return _fail(problem)
    from ..models.loader import default_quantize
    quantize = default_quantize(args.model_dir, device) if args.quantize is None else \
        None if args.quantize == "stored" else args.quantize
    from ..models.tokenizer import checkpoint_tokenizer
    tok = checkpoint_tokenizer(args.model_dir)[0]
    if args.prompt_ids:
        try:
            ids = [int(t) for t in args.prompt_ids.split(",")]
        except ValueError:
            return _fail(f"--prompt-ids takes comma-separated integers, got {args.prompt_ids!r}")
    elif tok is None:
        return _fail("--prompt needs the `tokenizers` package and a tokenizer (MODEL/tokenizer.json or a GGUF "
                     "vocabulary) (pip install tokenizers), or pass --prompt-ids")
    else:
        ids = tok.encode(args.prompt).ids
        if not ids:
            return _fail(f"the tokenizer turned --prompt {args.prompt!r} into no tokens")
    problem = check_token_ids(ids, config.vocab_size, "--prompt-ids" if args.prompt_ids else "--prompt") or \
        check_length(len(ids), args.max_new_tokens, args.max_seq_len)
    if problem:
        return _fail(problem)
    note = dense_note(config, quantize, args.group_size, args.quantize_head)
    if note:
        print(f"opforge generate: note: {note}", file=sys.stderr)
    from ..models.loader import load
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"quantize=.* stay dense")   # said above, with advice
            # one stream decodes one row per step: int4 codes in the rows layout, which the GEMV
            # reads fastest (the planes layout, the batched-decode default on CUDA, decodes the 1B
            # model at batch 1 at 0.91x: benchmarks/results/h100/2026-11-27-049b1c1)
            model = load(args.model_dir, device=args.device, quantize=quantize, group_size=args.group_size,
                         quantize_head=args.quantize_head, int4_layout="rows",
                         max_seq_len=min(args.max_seq_len, len(ids) + args.max_new_tokens + 1))
    except (UnsupportedModelError, opforge.SafetensorsError, FileNotFoundError) as exc:
        print(f"opforge generate: error: {exc}", file=sys.stderr)
        return 1
    if model.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(model.device)
    produced: list[int] = []

    def stream(b: int, token: int) -> None:
        produced.append(token)
        if tok is not None:    # decode the whole tail so multi-token characters come out right
            text, before = tok.decode(produced), tok.decode(produced[:-1])
            sys.stdout.write(text[len(before):])
        else:
            sys.stdout.write(f"{token} ")
        sys.stdout.flush()

    with opforge.trace() as t:
        generate(model, ids, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                 top_p=args.top_p, stop_ids=model.config.eos_token_ids, stream=stream,
                 graphs=not args.no_graphs, readback=args.readback)
    s = last_stats(model)
    print()
    print(f"prefill: {s.prompt_tokens} tokens, {s.prefill_tokens_per_s:.1f} tokens/s; decode: {s.new_tokens} tokens, "
          f"{s.decode_tokens_per_s:.1f} tokens/s ({'CUDA graph' if s.graphs else 'eager'}"
          f"{f', capture {s.capture_s * 1000:.0f} ms' if s.graphs else ''})")
    if model.device.type == "cuda":
        print(f"memory: {torch.cuda.max_memory_allocated(model.device) / 2**30:.2f} GiB peak, "
              f"weights {model.weight_bytes() / 2**30:.2f} GiB")
    else:
        print(f"memory: weights {model.weight_bytes() / 2**30:.3f} GiB")
    kernels = Counter((e.op, e.backend, e.variant) for e in t)
    print("kernels (eager calls traced; graph replays are not re-traced): " +
          ", ".join(f"{op}[{backend}/{variant}] x{n}" for (op, backend, variant), n in sorted(kernels.items())))
    return 0
