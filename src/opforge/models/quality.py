"""Quality of a loaded model on real text: perplexity on a fixed English passage (and on the same
words shuffled, the contrast a trained model must show), per weight format.

    python -m opforge.models.quality model.gguf        # prints the markdown table of docs/models.md

Example:
    >>> import torch
    >>> from opforge.models.quality import perplexity
    >>> from opforge.models.testing import tiny_decoder
    >>> ppl = perplexity(tiny_decoder(), torch.tensor([5, 6, 7, 8]))
    >>> ppl > 1.0
    True
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from typing import Any, Optional, Sequence

import torch

#: Plain English prose written for this measurement (about 330 tokens with a GPT-2-style vocabulary).
PASSAGE = (
    "The town sits at the mouth of a wide river, where the fresh water meets the sea. For most of "
    "its history it lived from fishing. Every morning before sunrise the boats went out past the "
    "lighthouse, and every afternoon they came back with their catch, which was sold at the market "
    "near the harbour. Children learned to mend nets before they learned to read, and the old men "
    "who sat on the benches by the water could tell the weather of the next day from the colour of "
    "the evening sky.\n\n"
    "Things changed when the railway arrived. The line brought visitors from the capital, who came "
    "for the clean air and the long sandy beach. Hotels were built along the promenade, and many "
    "families turned their houses into guest rooms during the summer months. The fishing fleet grew "
    "smaller each year, because young people found it easier to work in the shops and restaurants "
    "than to spend long cold nights at sea.\n\n"
    "Today the harbour is used mostly by sailing boats. A small museum in the old customs house "
    "shows photographs of the fishermen and their families, along with the tools they used and the "
    "songs they sang while they worked. In the winter, when the tourists have gone home, the town "
    "becomes quiet again. The cafes close early, the wind blows across the empty beach, and the few "
    "remaining fishermen still go out when the sea is calm enough. Many of the people who live there "
    "say that this is the best time of the year, because the town feels like it belongs to them "
    "once more.\n\n"
    "Scientists who study the river have found that the water is cleaner now than it was fifty years "
    "ago. Fish that had disappeared have returned, and birds nest again in the reeds along the banks. "
    "The town council hopes that careful planning will allow both the visitors and the wildlife to "
    "share the coast for many years to come."
)


def shuffled(text: str, seed: int = 0) -> str:
    """The words of ``text`` in a random (seeded) order: the same tokens, no sentences.

    Example:
        >>> sorted(shuffled("a b c d").split()) == ["a", "b", "c", "d"]
        True
    """
    words = text.split()
    random.Random(seed).shuffle(words)
    return " ".join(words)


@torch.no_grad()
def perplexity(model: Any, ids: torch.Tensor) -> float:
    """``exp`` of the mean negative log-likelihood of ``ids[1:]`` given the tokens before (one
    forward pass of the whole sequence; log-softmax in float32).

    Example:
        >>> from opforge.models.testing import tiny_decoder
        >>> round(perplexity(tiny_decoder(), torch.tensor([1, 2, 3])), 3) > 0
        True
    """
    ids = torch.as_tensor(ids).view(1, -1)
    logits = model.forward(ids).float()[0, :-1]
    nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:].to(logits.device))
    return float(nll.exp())


#: (label, opforge.models.load keyword arguments) of the table's rows.
FORMATS: tuple[tuple[str, dict], ...] = (
    ("float32 (dequantized file weights)", {"quantize": "dense", "dtype": torch.float32}),
    ("bfloat16", {"quantize": "dense", "dtype": torch.bfloat16}),
    ("as stored (GGUF codes imported, float32 compute)", {"quantize": None, "dtype": torch.float32}),
    ("int8 g32, requantized by opforge", {"quantize": "int8", "group_size": 32, "dtype": torch.float32}),
    ("int4 g64, requantized by opforge", {"quantize": "int4", "group_size": 64, "dtype": torch.float32}),
    ("int4 g32, requantized by opforge", {"quantize": "int4", "group_size": 32, "dtype": torch.float32}),
)


def quality_table(path: str, device: str = "cpu", formats: Sequence[tuple[str, dict]] = FORMATS,
                  text: Optional[str] = None) -> list[dict]:
    """Perplexity of the passage and of its shuffled words for each format (one load each).

    Returns rows ``{"format", "tokens", "ppl", "ppl_shuffled", "bytes", "seconds"}``."""
    from .loader import load
    text = PASSAGE if text is None else text
    rows = []
    for label, kwargs in formats:
        start = time.perf_counter()
        model = load(path, device=device, max_seq_len=1024, **kwargs)
        if model.tokenizer is None:
            raise ValueError(f"{path} has no tokenizer: perplexity on text needs one")
        ids = torch.tensor(model.tokenizer.encode(text).ids)
        mixed = torch.tensor(model.tokenizer.encode(shuffled(text)).ids)
        rows.append({"format": label, "tokens": int(ids.numel()), "ppl": perplexity(model, ids),
                     "ppl_shuffled": perplexity(model, mixed), "bytes": model.weight_bytes(),
                     "seconds": time.perf_counter() - start})
        del model
    return rows


def markdown(rows: list[dict]) -> str:
    """The rows as a markdown table (perplexity relative to the first row too)."""
    base = rows[0]["ppl"]
    lines = ["| weights | perplexity | vs. first row | shuffled words | weight MB |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['format']} | {r['ppl']:.3f} | {100 * (r['ppl'] / base - 1):+.2f}% | "
                     f"{r['ppl_shuffled']:.0f} | {r['bytes'] / 1e6:.1f} |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m opforge.models.quality MODEL``: print the quality table."""
    parser = argparse.ArgumentParser(prog="python -m opforge.models.quality", description=__doc__)
    parser.add_argument("model", help="a .gguf file or a Hugging Face directory")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    rows = []
    for fmt in FORMATS:                          # one row at a time: a slow machine shows progress
        rows += quality_table(args.model, args.device, [fmt])
        print(f"{fmt[0]}: {rows[-1]['ppl']:.3f} ({rows[-1]['seconds']:.0f} s)", file=sys.stderr, flush=True)
    print(f"{rows[0]['tokens']} tokens of opforge.models.quality.PASSAGE; shuffled: the same words in a "
          "seeded random order")
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
