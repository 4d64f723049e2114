"""``QuantizedWeight``: a (N, K) weight stored as 4- or 8-bit codes with a float scale and zero
per group of ``group_size`` consecutive elements of a row; and ``quantize_weight``.

A weight element is ``w[n, k] = (code[n, k] - zero[n, g]) * scale[n, g]`` with ``g = k // group``,
computed in float32. The storage (what the kernels read) is described in ``opforge.ops.quant``.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch

BITS = (4, 8)
#: Group sizes ``quantize_weight`` makes; ``from_codes`` also takes any other power of two >= 16.
QUANTIZE_GROUP_SIZES = (32, 64, 128, -1)
_SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_FP16_MIN_NORMAL = 2.0 ** -14
_FP16_MAX = 65504.0
_NIBBLE_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)   # code i of a word sits at bits 4i..4i+3
#: How int4 codes sit in their words (``QuantizedWeight.layout``). ``rows``: word ``j`` holds codes
#: ``8j .. 8j+7``. ``planes`` (``repack``): per chunk of ``PLANE_CHUNK`` codes of a row, word ``c``
#: (0..15) of the chunk holds at nibble ``i`` the code of column ``16i + c``, so nibble ``i`` of a
#: (rows, 16 words) tile is the (rows, 16) block of columns ``16i .. 16i+15``: a whole tensor-core
#: K step, unpacked where the word was loaded (no reshape, no trip through shared memory).
LAYOUTS = ("rows", "planes")
PLANE_CHUNK = 128


def check_bits(bits: object) -> int:
    """Return ``bits`` if it is 4 or 8, else raise ``ValueError``."""
    if isinstance(bits, bool) or bits not in BITS:
        raise ValueError(f"bits must be 4 or 8, got {bits!r}")
    return int(bits)


def check_group_size(group_size: object, k: int, allowed: Optional[tuple] = None) -> int:
    """Return the effective group (K for ``-1``); raise ``ValueError`` for a group size the
    kernels cannot take or one that does not divide K (K is never padded: a padded weight would
    no longer be the caller's (N, K))."""
    ok = isinstance(group_size, int) and not isinstance(group_size, bool) and (
        group_size == -1 or (group_size >= 16 and group_size & (group_size - 1) == 0))
    if allowed is not None:
        ok = ok and group_size in allowed
    if not ok:
        wanted = ", ".join(map(str, allowed)) if allowed else "-1 or a power of two >= 16"
        raise ValueError(f"group_size must be {wanted}, got {group_size!r}")
    if group_size == -1:
        return k
    if k % group_size:
        raise ValueError(f"K={k} (the weight's last dimension) is not a multiple of group_size={group_size}; "
                         "opforge does not pad: choose a group size that divides K, or -1 (one group per row)")
    return group_size


def _check_k(k: int, bits: int) -> None:
    if bits == 4 and k % 8:
        raise ValueError(f"int4 weights need K (the weight's last dimension) to be a multiple of 8 "
                         f"(8 codes per 32-bit word), got K={k}")
    if k == 0:
        raise ValueError("the weight has K=0 columns")


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes (N, K) in [0, 2**bits) -> the stored form: int4 as int32 words (N, K/8), code ``k``
    in bits ``4*(k%8)`` of word ``k//8``; int8 as uint8 (N, K).

    Example:
        >>> hex(pack_codes(torch.tensor([[1, 2, 3, 4, 5, 6, 7, 15]]), 4).item() & 0xFFFFFFFF)
        '0xf7654321'
    """
    if bits == 8:
        return codes.to(torch.uint8).contiguous()
    n, k = codes.shape
    c = codes.to(torch.int32).reshape(n, k // 8, 8) << _NIBBLE_SHIFTS.to(codes.device)
    return c.sum(dim=-1, dtype=torch.int32).contiguous()   # disjoint bit fields: the sum is an OR


def unpack_codes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """The inverse of ``pack_codes``: (N, K) int32 codes.

    Example:
        >>> c = torch.randint(0, 16, (3, 16))
        >>> torch.equal(unpack_codes(pack_codes(c, 4), 4), c.int())
        True
    """
    if bits == 8:
        return packed.to(torch.int32)
    n, words = packed.shape
    c = (packed.unsqueeze(-1) >> _NIBBLE_SHIFTS.to(packed.device)) & 0xF
    return c.reshape(n, words * 8)


def _planes_view(n: int, k: int) -> tuple[int, int, int, int]:
    return n, k // PLANE_CHUNK, 8, PLANE_CHUNK // 8      # (row, chunk, nibble i, word c)


def pack_planes(codes: torch.Tensor) -> torch.Tensor:
    """int4 codes (N, K), K a multiple of ``PLANE_CHUNK`` -> int32 words (N, K/8) in the
    ``planes`` layout: word ``16q + c`` holds at bits ``4i .. 4i+3`` the code of column
    ``128q + 16i + c``.

    Example:
        >>> c = torch.arange(128).remainder(16).view(1, 128)   # column k holds k % 16
        >>> hex(pack_planes(c)[0, 3].item() & 0xFFFFFFFF)      # columns 3, 19, .., 115: all code 3
        '0x33333333'
    """
    n, k = codes.shape
    c = codes.to(torch.int32).reshape(_planes_view(n, k)) << _NIBBLE_SHIFTS.to(codes.device).view(8, 1)
    return c.sum(dim=2, dtype=torch.int32).reshape(n, k // 8).contiguous()


def unpack_planes(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of ``pack_planes``: (N, K) int32 codes.

    Example:
        >>> c = torch.randint(0, 16, (3, 256))
        >>> torch.equal(unpack_planes(pack_planes(c)), c.int())
        True
    """
    n, words = packed.shape
    w = packed.reshape(n, words // 16, 1, 16)
    c = (w >> _NIBBLE_SHIFTS.to(packed.device).view(8, 1)) & 0xF
    return c.reshape(n, words * 8)


def _check_layout(layout: object, bits: int, k: int) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    misfit = _planes_shape_misfit(bits, k) if layout == "planes" else None
    if misfit:
        raise ValueError(misfit)
    return str(layout)


def _planes_shape_misfit(bits: int, k: int) -> Optional[str]:
    """Why int``bits`` codes with ``k`` columns cannot take the planes layout, or None."""
    if bits != 4 or k % PLANE_CHUNK:
        return f"the planes layout takes int4 weights with K a multiple of {PLANE_CHUNK}, got int{bits} with K={k}"
    return None


def _group_words(scales_t: torch.Tensor, zeros_t: Optional[torch.Tensor], bits: int) -> torch.Tensor:
    """One int32 per group and row for the planes kernel: the scale as float32 (a 16-bit scale
    leaves its low 13 mantissa bits 0) OR the integer zero (< 16) in bits 0..3, so one 4-byte
    word, which the kernel's pipeline can copy ahead, carries both; ``word & ~15`` is the scale
    exactly, ``word & 15`` the zero.

    Example:
        >>> w = _group_words(torch.tensor([[0.25]], dtype=torch.float16), torch.tensor([[3.0]], dtype=torch.float16), 4)
        >>> hex(w.item()), torch.tensor([w.item() & ~15], dtype=torch.int32).view(torch.float32).item()
        ('0x3e800003', 0.25)
    """
    zero = torch.full_like(scales_t, 2 ** (bits - 1), dtype=torch.int32) if zeros_t is None else zeros_t.to(torch.int32)
    return (scales_t.to(torch.float32).view(torch.int32) | zero).contiguous()


class QuantizedWeight:
    """A (N, K) weight as ``bits``-bit codes, with a scale (and zero) per ``group_size`` elements of a row.

    Build one with ``opforge.quantize_weight(w)`` or ``QuantizedWeight.from_codes(...)`` (GPTQ/AWQ
    import). ``dequantize()`` gives exactly ``(code - zero) * scale`` (float32, then cast), which
    is what ``opforge.linear`` computes with.

    Attributes:
        bits: 4 or 8.
        group_size: as given (``-1``: one group per row); ``group`` is the effective size.
        shape: ``(N, K)``.
        packed: the stored codes (int4: int32 (N, K/8); int8: uint8 (N, K)).
        layout: how int4 codes sit in their words, ``"rows"`` (``pack_codes``) or ``"planes"``
            (``pack_planes``, made by ``repack``; only the Triton ``planes`` variant reads it).
        group_words: planes layout: (K/group, N) int32, per group and row the float32 scale's
            bits OR the zero (``_group_words``; what the planes kernel reads; derived from scales
            and zeros, not saved; built by the constructor unless passed), else None.
        scales_t: (K/group, N) scales, float16/bfloat16/float32, transposed so that a kernel
            reads the scales of N-consecutive rows with one contiguous load.
        zeros_t: (K/group, N) zeros in code units, scales' dtype, or None (symmetric: 2**(bits-1)).

    Example:
        >>> import torch, opforge
        >>> qw = QuantizedWeight.from_codes(torch.randint(0, 16, (4, 64)), torch.rand(4, 2), None, 4, 32)
        >>> qw.shape, qw.dequantize().shape, qw.symmetric
        ((4, 64), torch.Size([4, 64]), True)
    """

    #: the int4 layouts (``repack``)
    LAYOUTS = LAYOUTS

    def __init__(self, packed: torch.Tensor, scales_t: torch.Tensor, zeros_t: Optional[torch.Tensor],
                 bits: int, group_size: int, shape: tuple[int, int], layout: str = "rows",
                 group_words: Optional[torch.Tensor] = None):
        self.packed, self.scales_t, self.zeros_t = packed, scales_t, zeros_t
        self.bits, self.group_size, self.shape = bits, group_size, (int(shape[0]), int(shape[1]))
        self.group = self.shape[1] if group_size == -1 else group_size
        self.layout = layout
        # planes: built here unless given (a module that keeps them as a buffer passes them, so
        # rebuilding the weight per call costs no conversion)
        if layout == "planes" and group_words is None:
            group_words = _group_words(scales_t, zeros_t, bits)
        self.group_words = group_words if layout == "planes" else None

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_codes(cls, codes: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor],
                   bits: int, group_size: int) -> "QuantizedWeight":
        """Wrap integer codes (N, K) in [0, 2**bits), scales (N, K // group) and zeros (same, in code
        units, or None for the symmetric zero 2**(bits-1)).

        Scales and zeros keep their dtype if float16, bfloat16 or float32 (float64 becomes
        float32), so ``dequantize`` reproduces ``(code - zero) * scale`` in float32 exactly.
        Raises ``ValueError``/``TypeError`` (naming the argument) before storing anything.

        Example:
            >>> codes = torch.tensor([[0, 15] * 16])
            >>> qw = QuantizedWeight.from_codes(codes, torch.tensor([[0.5]]), torch.tensor([[8.0]]), 4, -1)
            >>> qw.dequantize()[0, :2].tolist()
            [-4.0, 3.5]
        """
        bits = check_bits(bits)
        if not isinstance(codes, torch.Tensor) or codes.dim() != 2:
            raise ValueError(f"codes must be a 2-D (N, K) tensor, got "
                             f"{tuple(codes.shape) if isinstance(codes, torch.Tensor) else type(codes).__name__}")
        if codes.dtype.is_floating_point or codes.dtype.is_complex or codes.dtype == torch.bool:
            raise TypeError(f"codes must be an integer tensor, got {codes.dtype}")
        n, k = codes.shape
        _check_k(k, bits)
        check_group_size(group_size, k)
        if codes.numel():
            lo, hi = torch.stack(torch.aminmax(codes)).tolist()   # one pass, one device sync
            if lo < 0 or hi >= 2 ** bits:
                raise ValueError(f"codes must lie in [0, {2 ** bits}) for bits={bits}, got values in [{lo}, {hi}]")
        return cls._from_codes_in_range(codes, scales, zeros, bits, group_size)

    @classmethod
    def _from_codes_in_range(cls, codes: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor],
                             bits: int, group_size: int) -> "QuantizedWeight":
        """``from_codes`` after its checks of bits, K, group and the codes' range (which
        ``quantize_weight`` needs not repeat: its codes are clamped); checks scales and zeros."""
        n, k = codes.shape
        groups = k // (k if group_size == -1 else group_size)
        scales = _check_group_tensor("scales", scales, (n, groups), codes.device)
        if zeros is not None:
            zeros = _check_group_tensor("zeros", zeros, (n, groups), codes.device)
            if zeros.dtype != scales.dtype:   # one dtype for both; float32 holds either exactly
                zeros, scales = zeros.to(torch.float32), scales.to(torch.float32)
        return cls(pack_codes(codes, bits), scales.t().contiguous(),
                   None if zeros is None else zeros.t().contiguous(), bits, group_size, (n, k))

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> "QuantizedWeight":
        """Rebuild from ``state_dict()`` (ints may come back as 0-d tensors, as from safetensors).

        Example:
            >>> qw = quantize_weight(torch.randn(8, 64), bits=8, group_size=32)
            >>> torch.equal(QuantizedWeight.from_state_dict(qw.state_dict()).dequantize(), qw.dequantize())
            True
        """
        bits, group_size = int(d["bits"]), int(d["group_size"])
        n, k = int(d["out_features"]), int(d["in_features"])
        check_bits(bits)
        _check_k(k, bits)
        group = check_group_size(group_size, k)
        index = int(d.get("layout", 0))     # absent in weights saved before layouts existed: rows
        if not 0 <= index < len(LAYOUTS):
            raise ValueError(f"layout must be an index into {LAYOUTS}, got {index}")
        layout = _check_layout(LAYOUTS[index], bits, k)
        packed = d["qweight"]
        want = (n, k // 8) if bits == 4 else (n, k)
        want_dtype = torch.int32 if bits == 4 else torch.uint8
        if tuple(packed.shape) != want or packed.dtype != want_dtype:
            raise ValueError(f"qweight must be {want_dtype} of shape {want}, got {packed.dtype} {tuple(packed.shape)}")
        scales = _check_group_tensor("scales", d["scales"], (n, k // group), packed.device)
        zeros = d.get("zeros")
        if zeros is not None:
            zeros = _check_group_tensor("zeros", zeros, (n, k // group), packed.device)
        return cls(packed.contiguous(), scales.t().contiguous(),
                   None if zeros is None else zeros.t().contiguous(), bits, group_size, (n, k), layout)

    def state_dict(self) -> dict[str, Any]:
        """Plain tensors and ints: ``qweight`` (the packed codes), ``scales`` (N, K/group), ``zeros``
        (only if asymmetric), ``bits``, ``group_size``, ``out_features``, ``in_features``.

        The tensors are contiguous (scales and zeros are copied out of their transposed storage),
        so ``safetensors`` can save them; ints must become 0-d tensors there, which
        ``from_state_dict`` accepts back. A repacked weight adds ``layout``, its index in
        ``LAYOUTS`` (an int, so that safetensors can hold it; absent means ``rows``)."""
        d: dict[str, Any] = {"qweight": self.packed, "scales": self.scales.contiguous(), "bits": self.bits,
                             "group_size": self.group_size, "out_features": self.shape[0],
                             "in_features": self.shape[1]}
        if self.layout != "rows":
            d["layout"] = LAYOUTS.index(self.layout)
        if self.zeros_t is not None:
            d["zeros"] = self.zeros.contiguous()
        return d

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Replace this weight's contents with those of ``d`` (shape, bits and group may change)."""
        other = QuantizedWeight.from_state_dict(d)
        self.__dict__.update(other.__dict__)

    # ---- views --------------------------------------------------------------------------
    @property
    def scales(self) -> torch.Tensor:
        """(N, K / group) scales (a transposed view of the stored ``scales_t``)."""
        return self.scales_t.t()

    @property
    def zeros(self) -> Optional[torch.Tensor]:
        """(N, K / group) zeros in code units, or None when symmetric (zero = 2**(bits-1))."""
        return None if self.zeros_t is None else self.zeros_t.t()

    @property
    def symmetric(self) -> bool:
        return self.zeros_t is None

    @property
    def device(self) -> torch.device:
        return self.packed.device

    @property
    def nbytes(self) -> int:
        """Bytes stored: packed codes, scales and zeros (and the planes layout's group words)."""
        return sum(t.numel() * t.element_size() for t in (self.packed, self.scales_t, self.zeros_t, self.group_words)
                   if t is not None)

    def codes(self) -> torch.Tensor:
        """The (N, K) integer codes (int32), whatever the layout."""
        if self.layout == "planes":
            return unpack_planes(self.packed)
        return unpack_codes(self.packed, self.bits)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """(N, K) weight ``(code - zero) * scale``, computed in float32 (float64 if asked for), then cast.

        Example:
            >>> qw = QuantizedWeight.from_codes(torch.full((2, 32), 3), torch.full((2, 1), 0.25), None, 4, 32)
            >>> qw.dequantize(torch.float16)[0, 0].item()
            -1.25
        """
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        n, k = self.shape
        codes = self.codes().to(compute).view(n, k // self.group, self.group)
        zeros = (self.zeros.to(compute) if self.zeros_t is not None
                 else torch.full((n, k // self.group), float(2 ** (self.bits - 1)), dtype=compute, device=self.device))
        w = (codes - zeros.unsqueeze(-1)) * self.scales.to(compute).unsqueeze(-1)
        return w.view(n, k).to(dtype)

    def select_rows(self, index: torch.Tensor) -> "QuantizedWeight":
        """The weight of rows ``index`` (a 1-D integer tensor), codes, scales and zeros moved as they are.

        Example:
            >>> qw = quantize_weight(torch.randn(4, 64), 8, 32)
            >>> torch.equal(qw.select_rows(torch.tensor([3, 0])).dequantize(), qw.dequantize()[[3, 0]])
            True
        """
        pick = (lambda t: None if t is None else t.index_select(1, index).contiguous())
        return QuantizedWeight(self.packed.index_select(0, index).contiguous(), pick(self.scales_t),
                               pick(self.zeros_t), self.bits, self.group_size, (int(index.numel()), self.shape[1]),
                               self.layout)

    @classmethod
    def concat(cls, weights: "list[QuantizedWeight]") -> "QuantizedWeight":
        """Stack the rows of weights of one K, exactly: weights of one form are joined as they are;
        otherwise all are written in the widest form (int8 holds int4 codes, the smallest group
        repeats larger groups' scales, an explicit zero stands for the symmetric one, float32
        holds any scale), so every element keeps its value.

        Example:
            >>> a, b = quantize_weight(torch.randn(2, 64), 4, 64), quantize_weight(torch.randn(3, 64), 8, 32)
            >>> both = QuantizedWeight.concat([a, b])
            >>> both.bits, both.group, torch.equal(both.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
            (8, 32, True)
        """
        if not weights:
            raise ValueError("concat needs at least one QuantizedWeight")
        k = weights[0].shape[1]
        if any(w.shape[1] != k for w in weights):
            raise ValueError(f"concat needs one K, got {[w.shape for w in weights]}")
        forms = {(w.bits, w.group, w.symmetric, w.scales_t.dtype, w.layout) for w in weights}
        if len(forms) == 1:   # the layout is per row: rows of one layout join as they are
            zeros = None if weights[0].symmetric else torch.cat([w.zeros_t for w in weights], dim=1)
            return cls(torch.cat([w.packed for w in weights]), torch.cat([w.scales_t for w in weights], dim=1),
                       zeros, weights[0].bits, weights[0].group_size, (sum(w.shape[0] for w in weights), k),
                       weights[0].layout)
        bits, group = max(w.bits for w in weights), min(w.group for w in weights)
        codes, scales, zeros = [], [], []
        for w in weights:
            n = w.shape[0]
            repeat = w.group // group
            zero = w.zeros if w.zeros_t is not None else torch.full((n, k // w.group), float(2 ** (w.bits - 1)),
                                                                     device=w.device)
            codes.append(w.codes())
            scales.append(w.scales.to(torch.float32).repeat_interleave(repeat, dim=1))
            zeros.append(zero.to(torch.float32).repeat_interleave(repeat, dim=1))
        return cls._from_codes_in_range(torch.cat(codes), torch.cat(scales), torch.cat(zeros), bits,
                                        -1 if group == k and all(w.group_size == -1 for w in weights) else group)

    def to(self, device: Any) -> "QuantizedWeight":
        """A copy on ``device`` (this one if already there)."""
        device = torch.device(device)
        if device == self.device:
            return self
        move = (lambda t: None if t is None else t.to(device))
        return QuantizedWeight(move(self.packed), move(self.scales_t), move(self.zeros_t), self.bits,
                               self.group_size, self.shape, self.layout, move(self.group_words))

    def __repr__(self) -> str:
        n, k = self.shape
        kind = "symmetric" if self.symmetric else "asymmetric"
        if self.layout != "rows":
            kind += f", layout={self.layout}"
        return (f"QuantizedWeight(int{self.bits}, ({n}, {k}), group_size={self.group_size}, {kind}, "
                f"scales={str(self.scales_t.dtype).replace('torch.', '')}, {self.nbytes} bytes, {self.device})")


def repack(w: QuantizedWeight, layout: str) -> QuantizedWeight:
    """The same weight with its int4 codes in ``layout`` (``LAYOUTS``); scales and zeros shared.

    ``planes`` is what the Triton ``planes`` variant of ``linear`` reads (M 2..255; the GEMV
    reads it at one row with groups of >= 128, the dequantize kernel from 256 rows and on small
    weights from 33, the torch path always; the rows dot kernel and Metal do not); the model
    loader repacks int4 weights on CUDA (``preferred_layout``). It needs int4,
    K a multiple of ``PLANE_CHUNK``, integer zeros in [0, 16) (the kernel subtracts the zero from
    the code in x's 16-bit dtype, exactly; ``quantize_weight``'s zeros are integers) and float16
    or bfloat16 scales (``quantize_weight``'s, unless out of float16's range): each group's scale
    and zero travel in one int32 word (``group_words``). ``rows`` undoes it. Raises
    ``ValueError`` naming what does not fit.

    Example:
        >>> import torch
        >>> qw = quantize_weight(torch.randn(8, 256), bits=4, group_size=128)
        >>> pw = repack(qw, "planes")
        >>> pw.layout, torch.equal(pw.dequantize(), qw.dequantize()), torch.equal(repack(pw, "rows").packed, qw.packed)
        ('planes', True, True)
    """
    if not isinstance(w, QuantizedWeight):
        raise TypeError(f"w must be a QuantizedWeight, got {type(w).__name__}")
    layout = _check_layout(layout, w.bits, w.shape[1])
    if layout == w.layout:
        return w
    misfit = _planes_misfit(w) if layout == "planes" else None
    if misfit:
        raise ValueError(misfit)
    codes = w.codes()
    packed = pack_planes(codes) if layout == "planes" else pack_codes(codes, w.bits)
    return QuantizedWeight(packed, w.scales_t, w.zeros_t, w.bits, w.group_size, w.shape, layout)


def _planes_misfit(w: QuantizedWeight) -> Optional[str]:
    """Why ``w`` cannot take the planes layout (``repack``), or None."""
    shape = _planes_shape_misfit(w.bits, w.shape[1])
    if shape:
        return shape
    if w.scales_t.dtype not in (torch.float16, torch.bfloat16):
        return (f"the planes layout needs float16 or bfloat16 scales (their float32 form leaves 4 bits "
                f"for the zero), got {w.scales_t.dtype}")
    if w.zeros_t is not None:
        z = w.zeros_t
        bad = (z != z.round()) | (z < 0) | (z >= 16)
        if bool(bad.any()):
            g, n = (int(i) for i in bad.nonzero()[0])
            return f"the planes layout needs integer zeros in [0, 16); zeros[{n}, {g}] is {z[g, n].item()}"
    return None


def preferred_layout(w: QuantizedWeight, device: "torch.device | str") -> str:
    """The layout ``linear`` runs ``w`` fastest in on ``device``: ``"planes"`` for an int4 weight
    on CUDA that fits it (``repack``'s conditions) with groups of at least 128 (or one per row),
    the groups the H100 measurements cover; else ``"rows"`` (Metal and the CPU read rows).

    Example:
        >>> qw = quantize_weight(torch.randn(8, 256), bits=4, group_size=128)
        >>> preferred_layout(qw, "cuda"), preferred_layout(qw, "cpu")
        ('planes', 'rows')
    """
    if torch.device(device).type != "cuda" or w.bits != 4:
        return "rows"
    if not (w.group_size == -1 or w.group >= PLANE_CHUNK):
        return "rows"
    return "rows" if _planes_misfit(w) else "planes"


def _check_group_tensor(name: str, t: object, shape: tuple[int, int], device: torch.device) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.dtype.is_floating_point:
        raise TypeError(f"{name} must be a float tensor, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape} (N, K // group), got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but the codes are on {device}")
    bad = ~torch.isfinite(t)
    if bad.any():
        pos = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name} has a non-finite value at {pos}: {t[pos].item()}")
    return t if t.dtype in _SCALE_DTYPES else t.to(torch.float32)


def quantize_weight(w: torch.Tensor, bits: int = 4, group_size: int = 128, symmetric: bool = False) -> QuantizedWeight:
    """Quantize a (N, K) weight (``nn.Linear.weight``'s layout) to ``bits``-bit codes per group,
    rounding to nearest.

    Asymmetric (default): per group, ``scale = (max(w, 0) - min(w, 0)) / (2**bits - 1)`` and the
    integer ``zero = round(-min / scale)``, so 0 is exact. Symmetric: ``scale = max|w| / (2**(bits-1) - 1)``,
    zero ``2**(bits-1)``. Codes are ``clamp(round(w / scale) + zero, 0, 2**bits - 1)``.

    Scales (and zeros, integers in code units) are stored as float16 when every scale is a normal
    float16 number (the usual case): it halves their share of the bytes a GEMV streams (int4 g128:
    6% instead of 12.5%), and float16's 11-bit precision is far finer than the 4- or 8-bit step.
    The codes are computed with the float16-rounded scale, so the grid is exactly the one
    stored. Weights with scales outside float16's normal range keep float32 scales.

    Raises ``ValueError`` for a weight that is not 2-D or has a non-finite entry (naming its
    position), ``bits`` not 4/8, a group size not 32/64/128/-1 or not dividing K.

    Example:
        >>> import torch, opforge
        >>> w = torch.randn(64, 256)
        >>> qw = opforge.quantize_weight(w, bits=4, group_size=128)
        >>> qw
        QuantizedWeight(int4, (64, 256), group_size=128, asymmetric, scales=float16, 8704 bytes, cpu)
        >>> err = (qw.dequantize() - w).norm() / w.norm()    # about 0.1 for int4 g128 on Gaussian weights
        >>> bool(err < 0.15)
        True
    """
    bits = check_bits(bits)
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"w must be a torch.Tensor, got {type(w).__name__}")
    if w.dim() != 2:
        raise ValueError(f"w must be a 2-D (N, K) weight, got shape {tuple(w.shape)}")
    if not w.dtype.is_floating_point:
        raise TypeError(f"w must be a float tensor, got {w.dtype}")
    n, k = w.shape
    if n == 0:
        raise ValueError("w has N=0 rows")
    _check_k(k, bits)
    group = check_group_size(group_size, k, QUANTIZE_GROUP_SIZES)
    bad = ~torch.isfinite(w)
    if bad.any():
        pos = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"w has a non-finite value at {pos}: {w[pos].item()}")
    wf = w.detach().to(torch.float32).view(n, k // group, group)
    qmax = 2 ** bits - 1
    if symmetric:
        scale = wf.abs().amax(dim=-1) / (2 ** (bits - 1) - 1)
    else:
        lo = wf.amin(dim=-1).clamp(max=0)
        hi = wf.amax(dim=-1).clamp(min=0)
        scale = (hi - lo) / qmax
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))   # an all-zero group: any scale works
    nonzero = scale[scale > 0]
    fits16 = bool(((nonzero >= _FP16_MIN_NORMAL) & (nonzero <= _FP16_MAX)).all())
    store = torch.float16 if fits16 else torch.float32
    scale = scale.to(store).to(torch.float32)
    if symmetric:
        zero = torch.full_like(scale, float(2 ** (bits - 1)))
    else:
        zero = torch.round(-lo / scale).clamp(0, qmax)
    codes = torch.round(wf / scale.unsqueeze(-1)) + zero.unsqueeze(-1)
    codes = codes.clamp(0, qmax).to(torch.int32).view(n, k)
    return QuantizedWeight._from_codes_in_range(codes, scale.to(store), None if symmetric else zero.to(store),
                                                bits, group_size)
