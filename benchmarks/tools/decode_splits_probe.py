"""Split counts and key tiles of decode attention inside the 1B model's decode step (batch 1,
bf16, static cache), not in isolation: the whole step's CUDA graph timed
(``decode_step_ablation.step_us``) with the split rule replaced by a fixed count, or the key tile
(BLOCK_N) by a smaller one, at contexts 512 and 4096. One split writes the output directly (no
merge kernel); more splits need the merge.

    PYTHONPATH=src python benchmarks/tools/decode_splits_probe.py    # JSON in $OUT/decode_splits_probe.json
"""
from __future__ import annotations

import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(__file__))
from decode_step_ablation import step_us  # noqa: E402
from int4_candidate import write_json  # noqa: E402

from opforge.models import load  # noqa: E402
from opforge.models.testing import LLAMA_1B, write_random_checkpoint  # noqa: E402
from opforge.ops.attention import triton_kernels as attn  # noqa: E402

SPLITS = (None, 1, 2, 4, 8, 32)
BLOCKS = (32, 16)           # key tiles tried with the default split rule (which caps splits by them)


def main() -> int:
    directory = tempfile.mkdtemp(prefix="opforge-splits-")
    write_random_checkpoint(LLAMA_1B, directory, "cuda")
    model = load(directory, device="cuda", dtype=torch.bfloat16, max_seq_len=4608, max_batch=1)
    rule, tiles = attn.decode_splits_by_length, attn.decode_config
    rows = []
    for context in (512, 4096):
        model.prefill(torch.randint(0, model.config.vocab_size, (1, context)), torch.tensor([context]))
        row = {"context": context}
        for splits in SPLITS:
            attn.decode_splits_by_length = rule if splits is None else (lambda *a, s=splits: s)
            try:
                row["default" if splits is None else f"{splits} splits"] = step_us(model, "full")
            finally:
                attn.decode_splits_by_length = rule
        for block_n in BLOCKS:
            attn.decode_config = lambda *a, b=block_n, **k: tiles(*a, **k)[:1] + (b,) + tiles(*a, **k)[2:]
            try:
                row[f"BLOCK_N {block_n}"] = step_us(model, "full")
            finally:
                attn.decode_config = tiles
        print(row, flush=True)
        rows.append(row)
    write_json({"device": torch.cuda.get_device_name(), "rows": rows}, "decode_splits_probe.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
