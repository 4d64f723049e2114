"""Validation of ``linear`` arguments, and the problem description variants see."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

import torch

from ...runtime.errors import check_float_tensor
from ...runtime.problem import ProblemRecord
from .weight import QuantizedWeight

OPS = ("linear",)
#: Up to this many rows of x, the decode variant runs (all rows share each weight load).
DECODE_MAX_M = 16
#: From this many rows on, the weight is dequantized to x's dtype and cuBLAS multiplies (the
#: ``dequant_gemm`` variant): the dequantization costs one pass over N*K, small next to an
#: M*N*K GEMM this large. None turns it off. H100 tile sweep at 980a81d (int4 g128,
#: benchmarks/results/h100/2026-11-23-980a81d/quant_sweep.json): at M=256 dequant+cuBLAS 42.9 us vs the Triton GEMM
#: 112.9 (4096x4096), 439.6 vs 802.1 (28672x8192); M=64 stays on the Triton GEMM. End to end
#: (at 629522a): M=256 int4 1.41-3.09x, int8 1.04-1.27x the Triton GEMM (1024 rows before).
DEQUANT_GEMM_MIN_M: "Optional[int]" = 256
#: With the swapped dot tiles (``config.SWAP_MAX_M``), int4 weights of at
#: most this many elements (N*K) also take ``dequant_gemm`` for M 17..``DEQUANT_SMALL_MAX_M``:
#: there the dot kernel's time is mostly fixed cost. H100 sweep (at fed7445,
#: results/h100/2026-11-23-fed7445/run1, bf16 x, g128), int4 linear vs dequant+cuBLAS: M=64 3072x2048
#: 21.5 vs 11.6 us, 2048x2048 21.5 vs 10.0; M=32 12.2 vs 11.4, 12.1 vs 9.9. From 2048x8192 on
#: dequant+cuBLAS is slower (M=64 29.3 vs 23.5). int8 keeps its kernel (ahead or within a hair).
DEQUANT_SMALL_NK = 8 * 2 ** 20
DEQUANT_SMALL_MAX_M = 64
#: int4 weights take ``dequant_gemm`` from ``INT4_DEQUANT_MIN_M`` rows too (below
#: ``DEQUANT_GEMM_MIN_M``), except wide, short weights (N >= ``INT4_WIDE_N``, K <=
#: ``INT4_WIDE_MAX_K``) up to ``INT4_WIDE_MAX_M`` rows, where the Triton GEMM is still ahead. H100
#: (quant suite, bf16 x, g128, results/h100/2026-11-27-a133ac3/), dequant+cuBLAS vs the Triton GEMM
#: at M = 96 / 128 / 192, us: 2048x8192 34.7 / 37.0 / 40.6 vs 80.8 / 81.7 / 155.2; 4096x4096 31.7 /
#: 33.3 / 35.4 vs 80.1 / 79.8 / 80.5; 6144x4096 50.5 / 50.4 / 54.3 vs 78.3 / 76.4 / 104.9; 28672x4096
#: 215.7 / 214.5 / 220.4 vs 220.5 / 226.0 / 330.4; 4096x14336 114.3 / 115.5 / 117.3 vs 106.8 / 135.2 /
#: 200.2; wide: 16384x2048 66.2 / 67.0 / 68.8 vs 54.8 / 54.7 / 102.4, 128256x2048 468.3 / 474.1 /
#: 479.8 vs 436.6 / 439.4 / 641.4. int8 was not measured there and keeps its Triton GEMM.
INT4_DEQUANT_MIN_M = 65
INT4_WIDE_N = 16384
INT4_WIDE_MAX_K = 2048
INT4_WIDE_MAX_M = 128


@dataclass(frozen=True)
class LinearProblem(ProblemRecord):
    """What the variants\' support predicates and launch heuristics read; every field is in the
    selection key (``ProblemRecord``)."""

    dtype: torch.dtype
    m: int
    n: int
    k: int
    bits: int            # 0 for a dense weight
    group: int
    symmetric: bool
    has_bias: bool
    device_type: str
    layout: str = "rows"     # how int4 codes sit in their words (``weight.LAYOUTS``)
    swiglu: bool = False     # the output is silu(first half) * (second half) (``activation="swiglu"``)

    @property
    def planes(self) -> bool:
        """Whether the weight is in the ``planes`` layout (``weight.repack``): only the Triton
        ``planes`` variant (and the torch path) reads it."""
        return self.layout == "planes"

    @property
    def dense(self) -> bool:
        return self.bits == 0

    @property
    def decode(self) -> bool:
        return self.m <= DECODE_MAX_M

    @property
    def large(self) -> bool:
        threshold = DEQUANT_GEMM_MIN_M
        return threshold is not None and self.m >= threshold

    @property
    def small_int4(self) -> bool:
        """int4, M 17..``DEQUANT_SMALL_MAX_M``, N*K <= ``DEQUANT_SMALL_NK``: dequant+cuBLAS beats
        the swapped dot kernel."""
        return (self.bits == 4 and DECODE_MAX_M < self.m <= DEQUANT_SMALL_MAX_M
                and self.n * self.k <= DEQUANT_SMALL_NK)

    @property
    def mid_int4(self) -> bool:
        """int4, M ``INT4_DEQUANT_MIN_M`` and more, not a wide, short weight at up to
        ``INT4_WIDE_MAX_M`` rows: dequant+cuBLAS beats the Triton GEMM."""
        if self.bits != 4 or self.m < INT4_DEQUANT_MIN_M:
            return False
        wide = self.n >= INT4_WIDE_N and self.k <= INT4_WIDE_MAX_K
        return not (wide and self.m <= INT4_WIDE_MAX_M)

    @property
    def dequant_gemm(self) -> bool:
        """Whether the ``dequant_gemm`` variant runs this problem (given kernel dtypes): ``large``,
        ``small_int4`` or ``mid_int4``."""
        return self.large or self.small_int4 or self.mid_int4


    def describe(self) -> str:
        w = "dense" if self.dense else f"int{self.bits} g{self.group}{' sym' if self.symmetric else ''}"
        if self.planes:
            w += " planes"
        out = (f"x {str(self.dtype).replace('torch.', '')} (M={self.m}, K={self.k}) @ w {w} (N={self.n}, K={self.k})"
               f"{' + bias' if self.has_bias else ''}")
        return f"swiglu({out}) {self.device_type}" if self.swiglu else f"{out} {self.device_type}"


class LinearCall:
    """A validated call: x as (M, K) rows with unit last stride, the weight, bias, the output shape."""

    __slots__ = ("problem", "x", "w", "bias", "out_shape", "note")

    def __init__(self, problem: LinearProblem, x: torch.Tensor, w: Union[QuantizedWeight, torch.Tensor],
                 bias: Optional[torch.Tensor], out_shape: tuple, note: str):
        self.problem, self.x, self.w, self.bias, self.out_shape, self.note = problem, x, w, bias, out_shape, note


#: What ``linear``'s ``activation`` accepts besides None.
ACTIVATIONS = ("swiglu",)


def prepare(x: torch.Tensor, w: Union[QuantizedWeight, torch.Tensor], bias: Optional[torch.Tensor],
            activation: Optional[str] = None) -> LinearCall:
    """Check every argument (raising before anything is written) and describe the call."""
    check_float_tensor("x", x)
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (..., K), got a 0-d tensor")
    if isinstance(w, QuantizedWeight):
        n, k = w.shape
        bits, group, symmetric = w.bits, w.group, w.symmetric
        layout = w.layout
        w_device = w.device
    elif isinstance(w, torch.Tensor):
        if w.dim() != 2:
            raise ValueError(f"w must be a 2-D (N, K) weight or a QuantizedWeight, got shape {tuple(w.shape)}")
        check_float_tensor("w", w)
        if w.dtype != x.dtype:
            raise TypeError(f"a dense w must have x's dtype {x.dtype}, got {w.dtype}")
        n, k = w.shape
        bits, group, symmetric = 0, 0, False
        layout = "rows"
        w_device = w.device
    else:
        raise TypeError(f"w must be a QuantizedWeight or a torch.Tensor, got {type(w).__name__}")
    if x.shape[-1] != k:
        raise ValueError(f"x's last dimension ({x.shape[-1]}) must equal the weight's K={k} (w is ({n}, {k}))")
    if w_device != x.device:
        raise ValueError(f"w is on {w_device} but x is on {x.device}: all tensors must be on one device")
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
        if tuple(bias.shape) != (n,):
            raise ValueError(f"bias must have shape ({n},) (the weight's N), got {tuple(bias.shape)}")
        if bias.dtype != x.dtype:
            raise TypeError(f"bias must have x's dtype {x.dtype}, got {bias.dtype}")
        if bias.device != x.device:
            raise ValueError(f"bias is on {bias.device} but x is on {x.device}: all tensors must be on one device")
    swiglu = check_activation(activation, n)
    out_shape = tuple(x.shape[:-1]) + (n // 2 if swiglu else n,)
    note = ""
    if x.dim() > 1 and x.stride(-1) != 1 and x.numel():
        x = x.contiguous()
        note = "x copied: its last dimension is not contiguous"
    x2 = x.reshape(math.prod(x.shape[:-1]), k)     # (M, K); -1 cannot infer M when K is 0
    if not note and x.numel() and x2.data_ptr() != x.data_ptr():
        note = "x copied: its leading dimensions do not flatten to one stride"
    m = x2.shape[0]
    problem = LinearProblem(x.dtype, m, n, k, bits, group, symmetric, bias is not None, x.device.type, layout, swiglu)
    return LinearCall(problem, x2, w, bias, out_shape, note)


def check_activation(activation: Optional[str], n: int) -> bool:
    """Whether the call ends in SwiGLU; its weight stacks gate and up rows, so N must be even.

    Example:
        >>> check_activation(None, 7), check_activation("swiglu", 8)
        (False, True)
    """
    if activation is None:
        return False
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be None or one of {', '.join(ACTIVATIONS)}, got {activation!r}")
    if n % 2:
        raise ValueError(f"activation='swiglu' needs the gate and up rows stacked: an even N, got N={n}")
    return True
