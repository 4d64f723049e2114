"""``opforge generate MODEL --prompt "..."``: stream text, then speed, memory and kernels (MODEL: a
Hugging Face directory or a GGUF file)."""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import Optional, Sequence

import torch


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``opforge generate``; returns the exit status.

    Example:
        >>> from opforge.models.cli import main
        >>> from opforge.models.testing import write_tiny_checkpoint
        >>> import contextlib, io
        >>> with contextlib.redirect_stdout(io.StringIO()) as printed:
        ...     status = main([write_tiny_checkpoint(), "--prompt-ids", "1,2,3", "--max-new-tokens", "3"])
        >>> status, "tokens/s" in printed.getvalue()
        (0, True)
    """
    parser = argparse.ArgumentParser(prog="opforge generate", description=__doc__)
    parser.add_argument("model_dir", metavar="MODEL", help="a Hugging Face directory or a .gguf file")
    parser.add_argument("--prompt", default="", help="text (needs the `tokenizers` package and the model's tokenizer: "
                        "tokenizer.json or the GGUF file's vocabulary)")
    parser.add_argument("--prompt-ids", help="comma-separated token ids instead of text")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--quantize", choices=["dense", "int8", "int4"],
                        help="default: the weights as stored (a GGUF file's quantized ones kept)")
    parser.add_argument("--quantize-head", action="store_true", help="with --quantize, also the output head")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--max-seq-len", type=int, default=4096)
    parser.add_argument("--device")
    parser.add_argument("--no-graphs", action="store_true", help="run the decode step eagerly on CUDA")
    parser.add_argument("--readback", type=int, default=1,
                        help="decode steps between reads of the new tokens (MPS: >1 overlaps; unmeasured)")
    args = parser.parse_args(argv)

    import opforge
    from .loader import load
    from .tokenizer import checkpoint_tokenizer
    if not args.prompt and not args.prompt_ids:
        print("error: give a prompt: --prompt TEXT (with the `tokenizers` package and the model's tokenizer) "
              "or --prompt-ids 1,2,3", file=sys.stderr)
        return 2
    if args.readback < 1:
        print(f"error: --readback takes a number of decode steps >= 1, got {args.readback}", file=sys.stderr)
        return 2
    tok, _ = checkpoint_tokenizer(args.model_dir)
    if args.prompt_ids:
        try:
            ids = [int(t) for t in args.prompt_ids.split(",")]
        except ValueError:
            print(f"error: --prompt-ids takes comma-separated integers, got {args.prompt_ids!r}", file=sys.stderr)
            return 2
    elif tok is None:
        print("error: --prompt needs the `tokenizers` package and a tokenizer (MODEL/tokenizer.json or a GGUF "
              "vocabulary) (pip install tokenizers), or pass --prompt-ids", file=sys.stderr)
        return 2
    else:
        ids = tok.encode(args.prompt).ids
        if not ids:
            print(f"error: the tokenizer turned --prompt {args.prompt!r} into no tokens", file=sys.stderr)
            return 2
    model = load(args.model_dir, device=args.device, quantize=args.quantize, quantize_head=args.quantize_head,
                 max_seq_len=min(args.max_seq_len, len(ids) + args.max_new_tokens + 1))
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
        model.generate(ids, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                       top_p=args.top_p, stop_ids=model.config.eos_token_ids, stream=stream,
                       graphs=not args.no_graphs, readback=args.readback)
    s = model.last_stats
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
