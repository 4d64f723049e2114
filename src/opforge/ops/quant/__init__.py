"""Quantized-weight linear layers: ``QuantizedWeight``, ``quantize_weight`` and ``linear``.

Storage (what the kernels read; ``from_codes``/``dequantize`` hide it):

* int4: ``packed`` int32 (N, K/8), row-major; word ``j`` of row ``n`` holds codes
  ``k = 8j .. 8j+7``, code ``8j+i`` in bits ``4i .. 4i+3``. A kernel loads a (BLOCK_N, BLOCK_K/8)
  tile of words (16-byte vector loads along K) and unpacks it in registers with shifts.
* int4 repacked (``repack(w, "planes")``, ``QuantizedWeight.layout == "planes"``; what
  ``opforge.models.load`` gives int4 weights on CUDA, ``preferred_layout``): per chunk of 128
  codes of a row, nibble ``i`` of word ``c`` holds column ``16i + c``, so nibble ``i`` of a word
  tile is one tensor-core K step (``opforge.ops.quant.planes``, the ``planes`` variant, 1..255 rows;
  the GEMV reads it at one row under 16M weight elements, dequant+cuBLAS from 256 rows and on small
  weights from 65). Scale and zero then also travel as one int32 per group and row
  (``group_words``, derived). H100 (``quant_batch`` suite): 0.98-3.39x the rows layout at 2-128
  rows, 0.91-1.23x at one row (the decoder at batch 1: 1B 0.95x, 8B 1.03x).
* int8: ``packed`` uint8 (N, K), row-major.
* ``scales_t`` and ``zeros_t`` (K/group, N): transposed, so the scales of the BLOCK_N rows a
  program works on are one contiguous load. float16 from ``quantize_weight`` (see there);
  whatever float dtype ``from_codes`` was given (float64 becomes float32). Symmetric weights
  store no zeros (the zero is the constant ``2**(bits-1)``).

The kernels never round a dequantized weight to 16 bits: per group they compute
``scale * (sum_k x*code - zero * sum_k x)`` with the integer codes (exact in fp16/bf16) as the
tensor-core operand, so the result is what the QuantizedWeight represents up to float32
accumulation (the ``dequant_gemm`` variant, for M >= 256 rows, small int4 weights at M 17..64 and
int4 from M 65 (``problem.INT4_DEQUANT_MIN_M``), rounds the dequantized weight to x's dtype and lets cuBLAS multiply). Every call validates its arguments, selects a variant (Triton on CUDA, Metal
``qmv``/``qmm`` on MPS (``opforge.ops.quant.metal``, verified by emulation only), the torch path elsewhere), runs it and, inside ``opforge.trace()``,
records it. A dense weight runs ``torch.nn.functional.linear`` and is traced as the torch backend,
except one row of x (decode) with an fp16/bf16 weight on CUDA: opforge's dense GEMV
(``opforge.ops.quant.dense_gemv``, traced ``triton``/``dense_gemv``) unless a backend other than
``triton`` is forced.

Launch choices (tiles, K splits, variant thresholds) are the third H100 sweep's, measured end
to end at 629522a (against the earlier choices, since removed; benchmarks/NOTES.md): the in-kernel split
reduction for the int4 GEMV kernel (M <= 4), wide-K GEMV tiles for one row (the sweep at b634a74,
``config.wide_k_config``), int4 tiles of 128 features for M 5..16 and BLOCK_K
128 for M 33..64, and the ``dequant_gemm`` variant from M >= 256 rows. With the swapped dot
tiles (at f515a1a, ``config.SWAP_MAX_M``), the sweep at fed7445 (H100, bf16 x, int4 g128) adds
for int4 at M 17..64: ``dequant_gemm`` on weights of N*K <= 8*2**20 (M=64 2048x2048 21.5 ->
10.0 us, 3072x2048 21.5 -> 11.6; ``problem.DEQUANT_SMALL_NK``; from M 65 on every int4 weight
but wide, short ones up to 128 rows, ``problem.INT4_DEQUANT_MIN_M``), and at M 33..64 on N*K >=
48*2**20 the dot kernel not swapped, JOIN, (64, 128, 128) tiles (M=64 28672x4096 102.4 -> 94.7,
128256x2048 188.1 -> 160.8; ``config.UNSWAPPED_JOIN_MIN_NK``). The tile heuristics
and their measurements are in ``opforge.ops.quant.config`` (``problem`` holds the variant thresholds).
"""
from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn.functional as F

from ...runtime import alloc, dispatch, policy, trace
from ...runtime.compile_support import compiled
from ...runtime.errors import FLOAT_DTYPES
from . import epilogue, fakes, reference
from .problem import OPS, LinearCall, prepare
from .weight import QuantizedWeight, preferred_layout, quantize_weight, repack


try:   # the dense GEMV needs triton (absent on Macs)
    from . import dense_gemv
except ImportError:
    dense_gemv = None


def _torch_launch(call: LinearCall) -> torch.Tensor:
    return reference.run(call.x, call.w, call.bias, call.problem.swiglu).view(call.out_shape)


def _register() -> None:
    dispatch.register_family(OPS, dispatch.kernel_tables(__name__), _torch_launch,
                             "dequantize, then F.linear in float32 (float64 for float64 x)", _problem_builder)


def _problem_builder(op: str):
    def build(x, w, bias=None, activation=None):
        return prepare(x, w, bias, activation).problem

    return build


_Tensor = torch.Tensor
_FLOATS = frozenset(FLOAT_DTYPES)


def _cpu_dense(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """``F.linear`` at once for the plain case on the CPU (x on w's device, one float dtype, a
    2-D weight whose K matches, no bias or a matching one); None sends the call through
    ``prepare``, which checks everything and names what is wrong."""
    dtype = x.dtype
    if w.dtype != dtype or dtype not in _FLOATS or w.dim() != 2 or x.dim() == 0 \
            or x.shape[-1] != w.shape[1] or x.device != w.device:
        return None
    if bias is not None and not (type(bias) is _Tensor and bias.dtype == dtype and bias.dim() == 1
                                 and bias.shape[0] == w.shape[0] and bias.device == w.device):
        return None
    return F.linear(x, w, bias)


def _dense(call: LinearCall) -> torch.Tensor:
    return epilogue.finish(F.linear(call.x, call.w, call.bias), call)


def _dense_gemv(call: LinearCall) -> torch.Tensor:
    return dense_gemv.dense_gemv(call.x, call.w, call.bias, swiglu=call.problem.swiglu).view(call.out_shape)


@compiled("linear", None, route=fakes.route_linear)
def linear(x: torch.Tensor, w: Union[QuantizedWeight, torch.Tensor], bias: Optional[torch.Tensor] = None, *,
           activation: Optional[str] = None) -> torch.Tensor:
    """``x @ w.T + bias`` for a quantized (or dense) weight, as ``torch.nn.functional.linear``;
    with ``activation="swiglu"``, a gated MLP's fused gate|up projection and its activation.

    Args:
        x: (..., K) float16 or bfloat16 for the kernels (float32 and float64 run on the torch
            path). Rows may be strided; a non-contiguous last dimension is copied (trace says so).
        w: a ``QuantizedWeight`` of shape (N, K), or a dense (N, K) tensor of x's dtype (then
            torch's ``F.linear`` runs, and the trace says ``torch``/``dense``; for one row of
            fp16/bf16 x on CUDA opforge's dense GEMV, ``triton``/``dense_gemv``).
        bias: optional (N,) tensor of x's dtype.
        activation: None, or ``"swiglu"``: w stacks the gate rows over the up rows (N = 2F) and
            the result is ``silu(h[..., :F]) * h[..., F:]`` of the product h, (..., F). The dense
            one-row GEMV on CUDA fuses it: each program takes gate and up rows of the same
            features and applies it to its float32 sums, so h is never written (one launch less
            per MLP: the 1B bf16 decode step 1104 -> 1076 us on an H100). Every other kernel
            writes h and runs ``opforge.swiglu`` on its halves (its own kernel, traced); in the
            quantized one-row GEMV the fused form measured slower (1B int4 step +7-9 us).

    Returns:
        (..., N) in x's dtype ((..., N/2) with ``activation``); accumulation in float32. Triton
        variants: ``decode`` (M <= 16 rows), ``prefill`` (more rows) and ``dequant_gemm`` (M >=
        256, int4 M 17..64 with N*K <= 8*2**20, int4 from M 65 but wide short weights to 128
        rows: the weight dequantized to x's dtype, then cuBLAS), see
        ``opforge.ops.quant.triton_kernels``.
        Metal variants (MPS tensors, also float32 x): ``qmv`` (M <= 16) and ``qmm``, see
        ``opforge.ops.quant.metal``.

    Limits of the kernels (outside them the torch path runs: a fallback, traced, and strict mode
    or a forced backend raises ``NoKernelError``; ``opforge.explain("linear", x, w)`` names the
    limit): the Triton kernels need K >= 16 (``tl.dot`` tiles) and float16 or bfloat16 x; the
    Metal int8 kernels need K a multiple of 4 (4 codes per 32-bit word).

    Example:
        >>> import torch, opforge
        >>> w = torch.randn(64, 256)
        >>> qw = opforge.quantize_weight(w, bits=4, group_size=128)
        >>> x = torch.randn(3, 256)
        >>> y = opforge.linear(x, qw)
        >>> torch.allclose(y, x @ qw.dequantize().T, rtol=1e-4, atol=1e-4)
        True
        >>> h = x @ qw.dequantize().T
        >>> z = opforge.linear(x, qw, activation="swiglu")
        >>> z.shape, torch.allclose(z, torch.nn.functional.silu(h[:, :32]) * h[:, 32:], rtol=1e-4, atol=1e-4)
        (torch.Size([3, 32]), True)
    """
    if not trace._active and type(w) is _Tensor and type(x) is _Tensor and w.device.type == "cpu" \
            and activation is None:
        out = _cpu_dense(x, w, bias)
        if out is not None:
            return out
    call = prepare(x, w, bias, activation)
    p = call.problem
    if p.dense:
        if dense_gemv is not None and policy.forced_backend() in (None, "triton") and \
                dense_gemv.supported(call.x, call.w, p.m):
            if trace._active:
                return trace.run_traced("linear", "triton", "dense_gemv", x, call.note, _dense_gemv, call)
            return _dense_gemv(call)
        if trace._active:
            return trace.run_traced("linear", "torch", "dense", x, call.note, _dense, call)
        return _dense(call)
    if p.m == 0 or p.n == 0:
        return alloc.empty(call.out_shape, x.dtype, x.device)
    if p.k == 0:
        out = torch.zeros(call.out_shape[:-1] + (p.n,), dtype=x.dtype, device=x.device)
        return epilogue.finish(out + bias if bias is not None else out, call)
    return dispatch.run("linear", call, x)


fakes.bind(linear=linear)
_register()

__all__ = ["QuantizedWeight", "quantize_weight", "linear", "repack", "preferred_layout"]
