"""The decoder of ``opforge.models`` on the Metal kernels, end to end, in the MSL emulator.

Every op of a prefill and a decode step (norms, swiglu, rotary + cache append, prefill attention,
split-KV decode attention, quantized linear) and of ``generate``'s engine steps (paged rotary +
append, paged attention) runs its ``.metal`` kernel here, on the strided views and cache layouts
the decoder really passes; dense projections stay torch's ``F.linear`` by design.
The reference is the same model on the torch path (and, for half precision, the float64 model).
Head dim 64: the Metal prefill kernels take D in (64, 80, 96, 128, 256).
"""
import pytest
import torch

import opforge
from opforge.ops.attention.metal import decode_splits
from opforge.models.testing import TINY_LLAMA, tiny_decoder
from opforge.serve import generate
from opforge.testing import rel_error

pytestmark = pytest.mark.usefixtures("emulate")

CONFIG = {**TINY_LLAMA, "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2,
          "num_key_value_heads": 1, "head_dim": 64}
STEP_OPS = {"rms_norm", "add_rms_norm", "swiglu", "rotary_kv_cache_append", "decode_attention"}
FORWARD_OPS = {"rms_norm", "add_rms_norm", "swiglu", "rotary_embedding", "attention"}   # no cache
PREFILL_OPS = FORWARD_OPS | {"kv_cache_append"}
GENERATE_OPS = {"rms_norm", "add_rms_norm", "swiglu", "paged_rotary_kv_cache_append", "paged_attention"}  # the engine
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11]]


def model(**kwargs):
    return tiny_decoder(CONFIG, **{"max_seq_len": 48, "max_batch": 3, **kwargs})


def on(backend, fn):
    """``fn()`` with ``backend`` forced, and the ops that ran as {op: backend}."""
    with opforge.backend(backend), opforge.trace() as t:
        out = fn()
    return out, t


def metal_ops(trace):
    return {e.op for e in trace if e.backend == "metal"}


def test_float32_forward_and_batched_generation_equal_the_torch_path():
    m = model()
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(5))
    ref_logits, _ = on("torch", lambda: m.forward(ids))
    ref_tokens, _ = on("torch", lambda: generate(m, PROMPTS, 6))
    logits, t_prefill = on("metal", lambda: m.forward(ids))
    tokens, t_gen = on("metal", lambda: generate(m, PROMPTS, 6))
    assert rel_error(logits, ref_logits) < 1e-5 and ref_logits.abs().max() > 1.0
    assert tokens == ref_tokens and len({tuple(s) for s in tokens}) > 1
    assert FORWARD_OPS <= metal_ops(t_prefill), metal_ops(t_prefill)
    assert GENERATE_OPS <= metal_ops(t_gen), metal_ops(t_gen)
    assert all(e.backend == "metal" for e in t_gen if e.op != "linear")   # dense linear is F.linear
    assert {e.variant for e in t_gen if e.op == "linear"} == {"dense"}


def test_decode_steps_across_several_kv_splits_equal_the_full_forward():
    """A 150-token context: decode attention splits the cache and merges the splits."""
    m = model(max_seq_len=160, max_batch=1)
    ids = torch.randint(0, 64, (1, 150), generator=torch.Generator().manual_seed(6))
    full, _ = on("torch", lambda: m.forward(ids)[0])

    def prefill_then_decode():
        steps = [m.prefill(ids[:, :140], torch.tensor([140]))[0]]
        seqlens = m.cache_seqlens[:1]
        for pos in range(140, 150):
            steps.append(m.decode_step(ids[:, pos], seqlens)[0])
            seqlens.add_(1)
        return torch.stack(steps)
    got, t = on("metal", prefill_then_decode)
    assert decode_splits(rows=CONFIG["num_attention_heads"], s_max=160) >= 3
    assert rel_error(got, full[139:150]) < 1e-5
    assert {"attention", "decode_attention"} <= metal_ops(t)


def test_float16_model_is_as_close_to_float64_as_the_torch_path():
    """MPS's compute dtype (fp16): the Metal kernels' logits against the float64 model are no
    worse than the torch path's at fp16 (ratio <= 1.1, as for transformers' own bf16)."""
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(7))
    exact = model(dtype=torch.float64).forward(ids)
    m16 = model(dtype=torch.float16)
    ref, _ = on("torch", lambda: m16.forward(ids))
    got, t = on("metal", lambda: m16.forward(ids))
    assert got.dtype == torch.float16
    torch_err, metal_err = rel_error(ref, exact), rel_error(got, exact)
    assert metal_err < 5e-3 and metal_err <= 1.1 * torch_err, (metal_err, torch_err)
    assert FORWARD_OPS <= metal_ops(t)


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_quantized_model_runs_qmv_and_qmm_and_equals_the_torch_path(quantize):
    """Prefill of 2x12 rows runs ``qmm`` (M > 16), decode steps ``qmv``; both compute what the
    QuantizedWeights hold, so the logits equal the torch path's (which dequantizes them)."""
    m = model(quantize=quantize, group_size=64, quantize_head=True)
    assert type(m.lm_head).__name__ == "QuantizedWeight"
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(8))
    ref, _ = on("torch", lambda: m.forward(ids))
    ref_tokens, _ = on("torch", lambda: generate(m, PROMPTS[:2], 5))
    got, t_prefill = on("metal", lambda: m.forward(ids))
    tokens, t_gen = on("metal", lambda: generate(m, PROMPTS[:2], 5))
    assert rel_error(got, ref) < 1e-5 and tokens == ref_tokens
    assert {e.variant for e in t_prefill if e.op == "linear"} >= {"qmm"}
    assert {e.variant for e in t_gen if e.op == "linear" and e.backend == "metal"} >= {"qmv"}
    assert all(e.backend == "metal" for e in t_gen)
