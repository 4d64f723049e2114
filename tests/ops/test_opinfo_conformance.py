"""PyTorch's own OpInfo sample inputs, mapped onto the opforge ops that mirror torch ops.

For every torch op an opforge op mirrors (layer_norm, rms_norm, softmax, log_softmax, gelu, silu,
relu, scaled_dot_product_attention, linear with dense, int8 and int4 weights), each of the
OpInfo's sample inputs (``torch.testing._internal.common_methods_invocations.op_db``: edge
shapes, empty and 0-d tensors, odd eps, broadcast batch dims) is translated into the opforge call
that means the same, run on every backend here in each tested dtype, and compared with the torch
op in float64 on the same (rounded) inputs. Each sample is run twice with different values, so a
launch plan left by the first call serves the second.

Outcomes:
* match: within the dtype's tolerance of torch in float64;
* refused: an opforge error that names an argument of the call or says no kernel of the forced
  backend can run it (a documented limit: Metal attention's head sizes, the Triton quantized
  linear's K >= 16, a negative eps ...);
* not expressible: the sample uses what opforge does not mirror (dropout, an arbitrary attention
  mask, torch's top-left causal mask with more queries than keys, an output dtype argument,
  complex numbers); counted, not run.
A silent mismatch, or any other exception (a raw torch or Python error), fails.
"""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

import pytest
import torch
import torch.nn.functional as F

import opforge
from opforge.runtime.errors import NoKernelError
from opforge.testing import DEVICE, ON_GPU, TOLERANCE

pytest.importorskip("expecttest", reason="PyTorch's OpInfo database needs the expecttest package")
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

#: Samples per OpInfo (each run on every backend and dtype, twice): keeps CI time small.
MAX_SAMPLES = 12
#: bfloat16 only on a GPU: Triton's interpreter truncates to bfloat16 where a GPU rounds
DTYPES = (torch.float32, torch.float16, torch.bfloat16) if ON_GPU else (torch.float32, torch.float16)


class NotExpressible(Exception):
    """The sample uses something the opforge op does not mirror."""


@dataclass
class Mapped:
    """One sample as an opforge call and the torch op's float64 result on the same inputs."""

    run: Callable[[], torch.Tensor]
    expected: torch.Tensor
    op: Callable                        # the opforge function (its argument names judge error messages)


def _cast(t: Any, dtype: torch.dtype) -> Any:
    return t.to(DEVICE, dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t


def _f64(t: Any) -> Any:
    return t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t


def _flatten_trailing(t: Optional[torch.Tensor], dims: int) -> Optional[torch.Tensor]:
    """``t`` with its last ``dims`` dimensions merged into one (a norm over several trailing dims
    is the norm over their flattening)."""
    if t is None:
        return None
    return t.reshape(*t.shape[:t.dim() - dims], -1) if dims != 1 else t


def map_layer_norm(x, args, kwargs, dtype) -> Mapped:
    shape, weight, bias = (list(args) + [None, None])[:3]
    eps = kwargs.get("eps", 1e-5)
    x, weight, bias = (_cast(t, dtype) for t in (x, weight, bias))
    expected = F.layer_norm(_f64(x), shape, _f64(weight), _f64(bias), eps)
    n = len(shape)
    return Mapped(lambda: opforge.layer_norm(_flatten_trailing(x, n), _flatten_trailing(weight, n),
                                             _flatten_trailing(bias, n), eps).reshape(expected.shape),
                  expected, opforge.layer_norm)


def map_rms_norm(x, args, kwargs, dtype) -> Mapped:
    shape, weight = (list(args) + [None])[:2]
    eps = kwargs.get("eps")
    eps = torch.finfo(dtype).eps if eps is None else eps      # torch's default: the input dtype's eps
    x, weight = _cast(x, dtype), _cast(weight, dtype)
    expected = F.rms_norm(_f64(x), shape, _f64(weight), eps)
    n = len(shape)
    return Mapped(lambda: opforge.rms_norm(_flatten_trailing(x, n), _flatten_trailing(weight, n), eps)
                  .reshape(expected.shape), expected, opforge.rms_norm)


def _map_softmax(name: str):
    def mapping(x, args, kwargs, dtype) -> Mapped:
        if kwargs.get("dtype") is not None:
            raise NotExpressible("an output dtype argument (opforge computes in the input's dtype)")
        dim = args[0] if args else kwargs.get("dim", -1)
        x = _cast(x, dtype)
        ours = getattr(opforge, name)
        return Mapped(lambda: ours(x, dim), getattr(torch, name)(_f64(x), dim), ours)
    return mapping


def _map_pointwise(name: str):
    def mapping(x, args, kwargs, dtype) -> Mapped:
        if x.is_complex():
            raise NotExpressible("complex numbers")
        x = _cast(x, dtype)
        ours = getattr(opforge, name)
        return Mapped(lambda: ours(x, **kwargs), getattr(F, name)(_f64(x), **kwargs), ours)
    return mapping


def _widened(t: torch.Tensor, times: int) -> torch.Tensor:
    """``t`` repeated ``times`` times along its last dimension (K)."""
    return torch.cat([t] * times, dim=-1)


def _map_attention(d_times: int = 1):
    """``attention`` for an SDPA sample; with ``d_times`` > 1, q, k and v repeated along the head
    dimension that many times (the samples' D = 8 is below every Metal kernel's head sizes)."""
    def mapping(q, args, kwargs, dtype) -> Mapped:
        k, v = args[:2]
        if d_times > 1:
            q, k, v = (_widened(t, d_times) for t in (q, k, v))
        return map_attention(q, (k, v), kwargs, dtype)
    return mapping


def map_attention(q, args, kwargs, dtype) -> Mapped:
    k, v = args[:2]
    if kwargs.get("dropout_p", 0.0) > 0:
        raise NotExpressible("dropout (opforge is for inference)")
    if kwargs.get("attn_mask") is not None:
        raise NotExpressible("an arbitrary attention mask")
    causal, scale = kwargs.get("is_causal", False), kwargs.get("scale")
    q, k, v = (_cast(t, dtype) for t in (q, k, v))
    expected = F.scaled_dot_product_attention(_f64(q), _f64(k), _f64(v), is_causal=causal, scale=scale,
                                              enable_gqa=kwargs.get("enable_gqa", False))
    sq, sk = q.shape[-2], k.shape[-2]
    if causal and sq > sk:
        raise NotExpressible("torch's top-left causal mask with more queries than keys "
                             "(opforge's causal mask is aligned to the end of the keys, as documented)")
    if causal and sq < sk:     # torch's top-left mask sees keys j <= i: the end-aligned mask over the first Sq keys
        k, v = k[..., :sq, :], v[..., :sq, :]
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])

    def as_bhsd(t: torch.Tensor) -> torch.Tensor:     # the broadcast batch dims as (B, 1 head)
        return t.expand(*lead, *t.shape[-2:]).reshape(-1, 1, *t.shape[-2:])
    return Mapped(lambda: opforge.attention(as_bhsd(q), as_bhsd(k), as_bhsd(v), causal=causal, scale=scale)
                  .reshape(expected.shape), expected, opforge.attention)


def map_linear(x, args, kwargs, dtype) -> Mapped:
    w, bias = (list(args) + [None])[:2]
    x, w, bias = (_cast(t, dtype) for t in (x, w, bias))
    return Mapped(lambda: opforge.linear(x, w, bias), F.linear(_f64(x), _f64(w), _f64(bias)), opforge.linear)


def _map_quantized_linear(bits: int, k_times: int = 1):
    """``linear`` with the sample's weight quantized (one group per row); with ``k_times`` > 1, x
    and the weight repeated along K that many times, to reach the kernels' K >= 16 and the
    int4/Metal K multiples with the sample's other dimensions (batch dims, bias, empty rows) kept."""
    def mapping(x, args, kwargs, dtype) -> Mapped:
        w, bias = (list(args) + [None])[:2]
        if k_times > 1:
            x, w = _widened(x, k_times), _widened(w, k_times)
        x, bias = _cast(x, dtype), _cast(bias, dtype)
        box: dict = {}

        def run() -> torch.Tensor:
            qw = opforge.quantize_weight(w.to(DEVICE, torch.float32), bits, group_size=-1)
            box["weight"] = qw.dequantize(torch.float64)
            return opforge.linear(x, qw, bias)

        # the oracle multiplies by the weight the op was given: the dequantized codes
        def expected() -> torch.Tensor:
            return F.linear(_f64(x), box["weight"], _f64(bias))
        return Mapped(run, _Deferred(expected), opforge.linear)
    return mapping


class _Deferred:
    """An expected result computed after the call (it depends on what the call quantized)."""

    def __init__(self, make: Callable[[], torch.Tensor]):
        self.make = make


#: OpInfo name -> (label, mapping onto opforge)
MIRRORS = {
    "nn.functional.layer_norm": [("layer_norm", map_layer_norm)],
    "nn.functional.rms_norm": [("rms_norm", map_rms_norm)],
    "softmax": [("softmax", _map_softmax("softmax"))],
    "log_softmax": [("log_softmax", _map_softmax("log_softmax"))],
    "nn.functional.gelu": [("gelu", _map_pointwise("gelu"))],
    "nn.functional.silu": [("silu", _map_pointwise("silu"))],
    "nn.functional.relu": [("relu", _map_pointwise("relu"))],
    "nn.functional.scaled_dot_product_attention": [("attention", _map_attention()),
                                                   ("attention_d64", _map_attention(8))],
    "nn.functional.linear": [("linear", map_linear), ("linear_int8", _map_quantized_linear(8)),
                             ("linear_int4", _map_quantized_linear(4)),
                             ("linear_int8_k16x", _map_quantized_linear(8, 16)),
                             ("linear_int4_k16x", _map_quantized_linear(4, 16))],
}
CASES = [(name, label, mapping) for name, mappings in MIRRORS.items() for label, mapping in mappings]


def _opinfos(name: str) -> list:
    found = [o for o in op_db if o.name == name]
    assert found, f"OpInfo {name!r} is gone from this torch: update MIRRORS"
    return found


def _samples(name: str) -> list:
    """Up to MAX_SAMPLES (input, args, kwargs) of every OpInfo variant of ``name``, in float64 on the CPU."""
    out = []
    for info in _opinfos(name):
        for sample in info.sample_inputs("cpu", torch.float64, requires_grad=False):
            out.append((info.variant_test_name, sample.input, tuple(sample.args), dict(sample.kwargs)))
    if len(out) > MAX_SAMPLES:      # evenly spread over all of them (the last ones are often the odd cases)
        out = [out[round(i * (len(out) - 1) / (MAX_SAMPLES - 1))] for i in range(MAX_SAMPLES)]
    return out


def _perturbed(t: Any) -> Any:
    """Other values, same shape and layout: the second call of a sample (a launch plan left by
    the first serves it; its pointers and values must be the new ones)."""
    if isinstance(t, torch.Tensor) and t.is_floating_point():
        return t * -0.75 + 0.25
    if isinstance(t, (tuple, list)):
        return type(t)(_perturbed(a) for a in t)
    if isinstance(t, dict):
        return {k: _perturbed(a) for k, a in t.items()}
    return t


def _names_an_argument(exc: Exception, fn: Callable) -> bool:
    names = set(inspect.signature(fn).parameters) | {"K", "N", "D", "head_dim", "group_size", "bits"}
    return any(re.search(rf"\b{re.escape(n)}\b", str(exc)) for n in names)


def _is_clear_refusal(exc: Exception, fn: Callable) -> bool:
    """An opforge error naming the documented limit: no kernel of the forced backend (its reason
    given), or a ValueError/TypeError whose message names an argument."""
    if isinstance(exc, NoKernelError):
        return bool(exc.reason)
    return isinstance(exc, (ValueError, TypeError)) and _names_an_argument(exc, fn)


def _compare(got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    assert isinstance(got, torch.Tensor), f"{what}: returned {type(got).__name__}"
    assert got.shape == expected.shape, f"{what}: shape {tuple(got.shape)} != torch's {tuple(expected.shape)}"
    got = got.detach().double().cpu()
    expected = expected.detach().double().cpu()
    bad = ~torch.isfinite(expected)
    assert torch.equal(~torch.isfinite(got), bad), f"{what}: non-finite values where torch has none (or the reverse)"
    if bad.any():
        assert torch.equal(got[bad].isnan(), expected[bad].isnan()), f"{what}: NaN where torch has inf or the reverse"
        assert torch.equal(got[bad & ~expected.isnan()], expected[bad & ~expected.isnan()]), f"{what}: infinities differ"
    got, expected = got[~bad], expected[~bad]
    scale = expected.norm().item()
    err = (got - expected).norm().item() / scale if scale > 0 else (got - expected).norm().item()
    limit = TOLERANCE[dtype] * 4      # samples of a few elements: the norm-wise error is one element's rounding
    assert err <= limit, f"{what}: relative error {err:.2e} > {limit:.1e} (silent mismatch)"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name, label, mapping", CASES, ids=[label for _, label, _ in CASES])
def test_opinfo_samples_match_torch_or_are_refused_clearly(name, label, mapping, dtype, every_backend, plans_on):
    tally = {"match": 0, "refused": 0, "not expressible": 0}
    for index, (variant, x, args, kwargs) in enumerate(_samples(name)):
        for call in range(2):
            sample = (x, args, kwargs) if call == 0 else _perturbed((x, args, kwargs))
            what = f"{label} sample {index} ({variant or 'default'}, input {tuple(sample[0].shape)}, " \
                   f"{[tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in sample[1]]}, " \
                   f"{ {k: tuple(v.shape) if isinstance(v, torch.Tensor) else v for k, v in sample[2].items()} }) " \
                   f"on {every_backend} in {dtype}, {('first', 'second')[call]} run"
            try:
                mapped = mapping(*sample, dtype)
            except NotExpressible:
                tally["not expressible"] += 1
                break
            try:
                with opforge.backend(every_backend), opforge.trace() as t:
                    got = mapped.run()
            except Exception as exc:   # judged below: a clear refusal passes, anything else fails
                assert _is_clear_refusal(exc, mapped.op), f"{what}: unclear error {type(exc).__name__}: {exc}"
                tally["refused"] += 1
                break
            # a dense linear is torch's F.linear on every backend (documented, traced torch/dense)
            ran = {(e.backend, e.variant) for e in t}
            assert all(b == every_backend or (b, v) == ("torch", "dense") for b, v in ran), f"{what}: ran {ran}"
            expected = mapped.expected.make() if isinstance(mapped.expected, _Deferred) else mapped.expected
            _compare(got, expected, dtype, what)
            tally["match"] += call == 0
    assert sum(tally.values()) > 0
    print(f"{label} on {every_backend} in {dtype}: {tally}")
