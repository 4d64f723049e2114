"""Where a 1B decode step's microseconds go: the step's CUDA graph timed whole, then with one kind
of kernel left out at a time (its call returns an input instead of launching), batch 1, context
512. A difference is the most a fusion that removes those launches can save; it is timing only
(the ablated steps compute nothing useful and are not checked).

Kinds: the norms (``rms_norm``, ``add_rms_norm``), ``swiglu``, the rotary + KV-cache append, decode
attention (split + merge), every ``linear`` (the GEMVs: what is left is everything else), and all
but the GEMVs. Precisions: bf16 and int4 with the head quantized (planes, rows).

    PYTHONPATH=src python benchmarks/tools/decode_step_ablation.py    # JSON in $OUT/decode_step_ablation.json
"""
from __future__ import annotations

import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(__file__))
from int4_candidate import graph_us, write_json  # noqa: E402

from opforge import api as opforge   # the module the decoder calls through  # noqa: E402
from opforge.models import load  # noqa: E402
from opforge.models.testing import LLAMA_1B, write_random_checkpoint  # noqa: E402

CONTEXT = 512
NON_GEMV = ("norms", "swiglu", "rotary_append", "attention")


def _patches(kind: str, zeros: dict) -> dict:
    def no_linear(x, w, bias=None, activation=None):
        shape = (*x.shape[:-1], w.shape[0] // (2 if activation else 1))
        if shape not in zeros:            # filled by the warm-up run, before the capture
            zeros[shape] = torch.zeros(shape, dtype=x.dtype, device=x.device)
        return zeros[shape]
    table = {"norms": {"rms_norm": lambda x, w, eps=1e-6: x, "add_rms_norm": lambda a, h, w, eps=1e-6: (a, h)},
             "swiglu": {"swiglu": lambda g, u: g},
             "rotary_append": {"rotary_kv_cache_append": lambda q, k, v, kc, vc, s, cos, sin, check=True: q},
             "attention": {"decode_attention": lambda q, k, v, total, scale=None: q},
             "linear": {"linear": no_linear}}
    if kind == "non_gemv":
        out = {}
        for name in NON_GEMV:
            out.update(table[name])
        return out
    return table.get(kind, {})


def step_us(model, kind: str, replays: int = 50) -> float:
    """GPU time of one decode step (batch 1, its cache as filled) with ``kind`` left out: the
    patches are in place while the step is warmed up and captured, then restored."""
    zeros: dict = {}
    saved = {name: getattr(opforge, name) for name in _patches(kind, zeros)}
    for name, fn in _patches(kind, zeros).items():
        setattr(opforge, name, fn)
    tokens = torch.zeros((1,), dtype=torch.long, device="cuda")
    try:
        return graph_us([lambda: model.decode_step(tokens, model.cache_seqlens[:1], float_logits=False)], replays)
    finally:
        for name, fn in saved.items():
            setattr(opforge, name, fn)


def main() -> int:
    directory = tempfile.mkdtemp(prefix="opforge-ablation-")
    write_random_checkpoint(LLAMA_1B, directory, "cuda")
    result = {"device": torch.cuda.get_device_name(), "context": CONTEXT, "rows": []}
    kinds = ["full", "norms", "swiglu", "rotary_append", "attention", "linear", "non_gemv"]
    for precision, quantize, layout in (("bf16", None, None), ("int4-head planes", "int4", "planes"),
                                        ("int4-head rows", "int4", "rows")):
        model = load(directory, device="cuda", dtype=torch.bfloat16, quantize=quantize, quantize_head=bool(quantize),
                     max_seq_len=1024, max_batch=1, int4_layout=layout)
        ids = torch.randint(0, model.config.vocab_size, (1, CONTEXT))
        model.prefill(ids, torch.tensor([CONTEXT]))
        row = {"precision": precision}
        for kind in kinds:
            row[kind] = step_us(model, kind)
        full = row["full"]
        row["saved_us"] = {k: round(full - row[k], 1) for k in kinds[1:]}
        print(precision, {k: round(row[k], 1) for k in kinds}, "saved", row["saved_us"], flush=True)
        result["rows"].append(row)
        del model
        torch.cuda.empty_cache()
    write_json(result, "decode_step_ablation.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
