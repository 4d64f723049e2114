"""``load_safetensors``: stream a checkpoint tensor by tensor onto a device, converting and
quantizing there, with pre-quantized (GPTQ, AWQ) and opforge-saved quantized layers rebuilt."""
from __future__ import annotations

import fnmatch
import json
import os
import warnings
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

import torch

from . import prequant
from .errors import SafetensorsError
from .format import Entry, Header, checkpoint_files, read_header
from .progress import LoadProgress
from .reader import TensorReader
from .save import META_QUANTIZED, QUANT_SEP, _quantized_type

Skip = Union[str, Iterable[str], Callable[[str], bool], None]
DEFAULT_EXCLUDE = ("embed", "wte", "lm_head")
QUANTIZE_BITS = {"int4": 4, "int8": 8}


def _skip_test(skip: Skip) -> Callable[[str], bool]:
    if skip is None:
        return lambda name: False
    if callable(skip):
        return skip
    patterns = (skip,) if isinstance(skip, str) else tuple(skip)
    return lambda name: any(name == p or fnmatch.fnmatchcase(name, p) for p in patterns)


def default_quantize_filter(exclude: Iterable[str] = DEFAULT_EXCLUDE) -> Callable[[str, torch.Tensor], bool]:
    """The weights ``quantize=`` converts by default: 2-D floating tensors named ``*.weight``,
    except embeddings and heads (names containing any of ``exclude``) and norms.

    Example:
        >>> import torch
        >>> from opforge.io.load import default_quantize_filter
        >>> f = default_quantize_filter()
        >>> w = torch.empty(8, 8)
        >>> f("layers.0.mlp.up_proj.weight", w), f("model.embed_tokens.weight", w), f("lm_head.weight", w)
        (True, False, False)
        >>> f("layers.0.input_layernorm.weight", torch.empty(8)), f("layers.0.mlp.up_proj.bias", w)
        (False, False)
    """
    words = tuple(exclude)

    def wanted(name: str, t: torch.Tensor) -> bool:
        lowered = name.lower()
        return (t.dim() == 2 and t.dtype.is_floating_point and name.endswith(".weight")
                and "norm" not in lowered and not any(w in name for w in words))

    return wanted


class _Plan:
    """Which entries to read, in file order, and how to group the parts of quantized layers."""

    def __init__(self, headers: List[Header], index: Dict[str, str], skipped: Callable[[str], bool]):
        self.entries: List[Entry] = []
        self.opforge_fields: Dict[str, Dict[str, Any]] = {}   # key -> non-tensor fields
        self.group_of: Dict[str, Tuple[str, str, str]] = {}   # entry name -> (kind, group key, field)
        self.group_size: Dict[str, int] = {}                  # group key -> number of tensor parts
        self.file_of: Dict[str, str] = {}
        present = {e.name: h.file for h in headers for e in h.entries}
        for name, file in index.items():
            if name not in present:
                raise SafetensorsError(f"the index lists this tensor in {os.path.basename(file)}, which lacks it",
                                       file, name)
            if present[name] != file:
                raise SafetensorsError(f"the index places this tensor in {os.path.basename(file)}", present[name], name)
        gptq_prefixes = {p[0] for p in map(prequant.split_part, present) if p and p[1] == "qweight"}
        for h in headers:
            saved = h.metadata.get(META_QUANTIZED)
            if saved:
                try:
                    fields = json.loads(saved)
                    assert isinstance(fields, dict)
                except (ValueError, AssertionError):
                    raise SafetensorsError(f"corrupt header: metadata {META_QUANTIZED} is not a JSON object",
                                           h.file) from None
                self.opforge_fields.update(fields)
            for e in h.entries:
                if index and e.name not in index:
                    continue  # a shard's tensor the index does not list is not part of the checkpoint
                key, sep, field = e.name.rpartition(QUANT_SEP)
                part = prequant.split_part(e.name)
                if sep and key in self.opforge_fields:
                    group = ("opforge", key, field)
                elif part and part[0] in gptq_prefixes:
                    group = ("prequant", part[0], part[1])
                else:
                    group = None
                out_name = group[1] + (".weight" if group[0] == "prequant" else "") if group else e.name
                if skipped(out_name) or skipped(e.name):
                    continue
                self.entries.append(e)
                self.file_of[out_name] = e.file
                if group:
                    self.group_of[e.name] = group
                    self.group_size[group[1]] = self.group_size.get(group[1], 0) + 1
        for key in self.opforge_fields:
            if key not in self.group_size and not skipped(key):
                raise SafetensorsError("quantized weight listed in the metadata has no tensors", headers[0].file, key)


def load_safetensors(
    path: Union[str, os.PathLike],
    device: Union[str, torch.device, None] = None,
    dtype: Optional[torch.dtype] = None,
    quantize: Optional[str] = None,
    group_size: int = 128,
    skip: Skip = None,
    progress: Optional[bool] = None,
    *,
    symmetric: bool = False,
    quantize_filter: Optional[Callable[[str, torch.Tensor], bool]] = None,
    quantize_exclude: Iterable[str] = DEFAULT_EXCLUDE,
    gptq_format: Optional[str] = None,
    into: Any = None,
    strict: bool = True,
) -> Dict[str, Any]:
    """Load a SafeTensors checkpoint tensor by tensor onto ``device``, optionally quantizing.

    Each tensor is read from the file into a buffer of its own (CUDA: through two 32 MiB pinned
    staging buffers, the GPU copying one while the host fills the other), converted and/or
    quantized on the device, and the raw bytes released, so host memory grows by about one
    tensor at most (on CUDA by the two staging buffers), never by the checkpoint's size.

    Args:
        path: a ``.safetensors`` file, a ``model.safetensors.index.json``, or a folder holding
            one of them or ``model.safetensors``.
        device: where the tensors go (default CPU).
        dtype: converts floating tensors (integer and bool tensors, and the scales of
            pre-quantized layers, keep theirs).
        quantize: ``"int4"`` or ``"int8"`` turns the weights chosen by ``quantize_filter``
            into ``opforge.QuantizedWeight`` (``opforge.quantize_weight`` with ``group_size``
            and ``symmetric``). Weights whose K the group does not divide stay unquantized, with
            a warning.
        group_size: the quantization group along K.
        skip: names not loaded: a name, a glob pattern (``"*.rotary_emb.inv_freq"``), a list of
            them, or a callable ``name -> bool``.
        progress: a bar on stderr (tensors, bytes, GB/s). None: only if stderr is a terminal and
            the load takes over 2 s; True: always; False: never.
        symmetric: symmetric quantization (zero = 2**(bits-1)).
        quantize_filter: ``(name, tensor) -> bool`` choosing the weights to quantize, asked
            before the tensor is read: ``tensor`` is a "meta" tensor with the weight's shape
            and (converted) dtype, no values. Default: 2-D floating ``*.weight`` tensors whose
            names contain no ``quantize_exclude`` word nor "norm".
        quantize_exclude: name parts never quantized by the default filter.
        gptq_format: GPTQ zero convention, ``"v1"`` (``qzeros`` holds zero - 1: AutoGPTQ,
            transformers) or ``"v2"`` (the zero itself: GPTQModel's ``gptq_v2``). None: v2 if
            the folder's config says ``checkpoint_format: gptq_v2``, else v1. The tensors alone
            cannot tell the two apart.
        into: a dict or ``torch.nn.Module`` to update once every tensor has loaded (nothing is
            applied if any fails): a dict is updated; a module gets ``load_state_dict``
            (tensors) and, for a ``QuantizedWeight``, the one it holds there replaced (it must
            have the same shape, bits, group and symmetry; behind ``opforge.nn.QuantLinear``'s
            ``weight`` property, its buffers are replaced).
        strict: with a module ``into``, every one of its state-dict keys must be loaded and
            every loaded key must be one of them, with the same shape.

    Returns:
        name -> tensor or ``QuantizedWeight``. GPTQ/AWQ layers ``<prefix>.qweight``/``qzeros``/
        ``scales``/``g_idx`` come back as one ``QuantizedWeight`` under ``<prefix>.weight``.

    Raises:
        opforge.SafetensorsError: a truncated or corrupt file, a tensor whose bytes disagree
            with its shape or that the index misplaces, a missing shard, an unsupported dtype,
            an act-order GPTQ layer; the message names the file and tensor.

    Example:
        >>> import os, tempfile, torch, opforge
        >>> d = tempfile.mkdtemp()
        >>> opforge.save_safetensors({"fc.weight": torch.randn(64, 128), "fc.bias": torch.zeros(64)},
        ...                          os.path.join(d, "model.safetensors"))
        >>> sd = opforge.load_safetensors(d, dtype=torch.bfloat16, quantize="int8", group_size=64)
        >>> type(sd["fc.weight"]).__name__, sd["fc.bias"].dtype
        ('QuantizedWeight', torch.bfloat16)
    """
    device = torch.device(device if device is not None else "cpu")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if quantize is not None and quantize not in QUANTIZE_BITS:
        raise ValueError(f"quantize must be None, 'int4' or 'int8', got {quantize!r}")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating torch.dtype or None, got {dtype!r}")
    if quantize is not None and not (isinstance(group_size, int) and not isinstance(group_size, bool) and (
            group_size == -1 or (group_size >= 16 and group_size & (group_size - 1) == 0))):
        raise ValueError(f"group_size must be -1 or a power of two >= 16, got {group_size!r}")
    if gptq_format not in (None, "v1", "v2"):
        raise ValueError(f"gptq_format must be None, 'v1' or 'v2', got {gptq_format!r}")
    files, index, folder = checkpoint_files(path)
    headers = [read_header(f) for f in files]
    plan = _Plan(headers, index, _skip_test(skip))
    wants_quant = quantize_filter or default_quantize_filter(quantize_exclude)
    config = prequant.QuantConfig.find(folder)
    out: Dict[str, Any] = {}
    pending: Dict[str, Dict[str, torch.Tensor]] = {}
    not_quantized: List[str] = []
    bar = LoadProgress(len(plan.entries), sum(e.nbytes for e in plan.entries), enabled=progress)
    try:
        with TensorReader(device) as reader:
            todo = {e.name: _Todo.decide(e, dtype, quantize, group_size, wants_quant, quantize_filter is not None,
                                         not_quantized) for e in plan.entries if e.name not in plan.group_of}
            reader.scratch_hint = max([e.nbytes for e in plan.entries if e.name in todo and todo[e.name].scratch],
                                      default=0)
            for e in plan.entries:
                group = plan.group_of.get(e.name)
                if group is not None:
                    kind, key, field = group
                    parts = pending.setdefault(key, {})
                    parts[field] = reader.read(e)
                    if len(parts) == plan.group_size[key]:
                        del pending[key]
                        if kind == "opforge":
                            out[key] = _rebuild_saved(key, parts, plan.opforge_fields[key], e.file)
                        else:
                            out[key + ".weight"] = _rebuild_prequant(key, parts, config, gptq_format, e.file)
                else:
                    job = todo[e.name]
                    out[e.name] = job.run(e, reader.read(e, scratch=job.scratch), dtype, group_size, symmetric)
                bar.advance(e.nbytes)
    finally:
        bar.close()
    if not_quantized:
        warnings.warn(f"load_safetensors: {len(not_quantized)} weight(s) left unquantized because "
                      f"group_size={group_size} does not divide K or K is not a multiple of 8: "
                      f"{', '.join(not_quantized[:5])}{' ...' if len(not_quantized) > 5 else ''}", stacklevel=2)
    if into is not None:
        _apply(into, out, plan.file_of, strict)
    return out


class _Todo:
    """What happens to one plain tensor once read, decided from its header alone."""

    def __init__(self, convert: bool, bits: Optional[int]):
        self.convert, self.bits = convert, bits
        self.scratch = convert or bits is not None  # the raw bytes are dropped right away

    @classmethod
    def decide(cls, e: Entry, dtype, quantize, group_size, wants_quant, custom_filter: bool,
               not_quantized: List[str]) -> "_Todo":
        convert = dtype is not None and e.dtype.is_floating_point and e.dtype != dtype
        bits = None
        if quantize is not None:
            meta = torch.empty(e.shape, dtype=dtype if convert else e.dtype, device="meta")
            if wants_quant(e.name, meta):
                bits = QUANTIZE_BITS[quantize]
                k = e.shape[-1] if e.shape else 0
                fits = k > 0 and (group_size == -1 or k % group_size == 0) and (bits == 8 or k % 8 == 0)
                if not fits and not custom_filter:
                    not_quantized.append(e.name)
                    bits = None
        return cls(convert, bits)

    def run(self, e: Entry, t: torch.Tensor, dtype, group_size: int, symmetric: bool) -> Any:
        if self.convert:
            t = t.to(dtype)
        if self.bits is None:
            return t
        from ..ops.quant import quantize_weight

        try:
            return quantize_weight(t, bits=self.bits, group_size=group_size, symmetric=symmetric)
        except (ValueError, TypeError) as err:
            raise type(err)(f"{e.name} (in {e.file}): cannot quantize: {err}") from None


def _rebuild_saved(key: str, parts: Dict[str, torch.Tensor], fields: Dict[str, Any], file: str) -> Any:
    from ..ops.quant import QuantizedWeight

    d: Dict[str, Any] = {**fields, **parts}
    try:
        return QuantizedWeight.from_state_dict(d)
    except (ValueError, TypeError, KeyError) as err:
        raise SafetensorsError(f"cannot rebuild the quantized weight: {err}", file, key) from None


def _rebuild_prequant(prefix: str, parts: Dict[str, torch.Tensor], config, gptq_format, file: str) -> Any:
    from ..ops.quant import QuantizedWeight

    codes, scales, zeros, bits, group = prequant.decode(prefix, parts, config, gptq_format, file)
    try:
        return QuantizedWeight.from_codes(codes, scales, zeros, bits, -1 if group == codes.shape[1] else group)
    except (ValueError, TypeError) as err:
        raise SafetensorsError(f"cannot represent this pre-quantized layer: {err}", file, prefix + ".qweight") from None


def _apply(into: Any, loaded: Dict[str, Any], file_of: Dict[str, str], strict: bool) -> None:
    """Update ``into`` with ``loaded`` only after checking that every value fits."""
    if isinstance(into, dict):
        into.update(loaded)
        return
    if not isinstance(into, torch.nn.Module):
        raise TypeError(f"into must be a dict or a torch.nn.Module, got {type(into).__name__}")
    qtype = _quantized_type()
    own = into.state_dict()
    quantized: Dict[str, Any] = {}
    tensors: Dict[str, torch.Tensor] = {}
    covered: set = set()  # module keys a quantized weight provides
    for name, v in loaded.items():
        if qtype is not None and isinstance(v, qtype):
            owner_name, _, attr = name.rpartition(".")
            try:
                owner = into.get_submodule(owner_name) if owner_name else into
            except AttributeError:
                owner = None
            held = getattr(owner, attr, None)
            if not isinstance(held, qtype):
                raise SafetensorsError("a quantized weight, but the module holds no QuantizedWeight there "
                                       "(load into a dict, or quantize the module first)", file_of.get(name), name)
            if (held.shape, held.bits, held.group_size, held.symmetric) != (v.shape, v.bits, v.group_size, v.symmetric):
                raise SafetensorsError(f"{v!r} disagrees with the module's {held!r} (shape, bits, group or zeros)",
                                       file_of.get(name), name)
            quantized[name] = (owner, attr, v)
            if isinstance(getattr(type(owner), attr, None), property):
                covered.update(f"{owner_name}.{b}" if owner_name else b for b in _QUANT_BUFFERS)
        elif name in own:
            if tuple(own[name].shape) != tuple(v.shape):
                raise SafetensorsError(f"shape {tuple(v.shape)} disagrees with the module's {tuple(own[name].shape)}",
                                       file_of.get(name), name)
            tensors[name] = v
        elif strict:
            raise SafetensorsError("the module has no such parameter or buffer", file_of.get(name), name)
    if strict:
        missing = [k for k in own if k not in tensors and k not in covered]
        if missing:
            raise SafetensorsError(f"{len(missing)} of the module's tensors are not in the checkpoint: "
                                   f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    into.load_state_dict(tensors, strict=False)
    for owner, attr, v in quantized.values():
        _set_quantized(owner, attr, v)


def _set_quantized(owner: torch.nn.Module, attr: str, v: Any) -> None:
    """Put ``v`` where ``owner.attr`` is: an attribute, or the buffers behind a property (as
    ``opforge.nn.QuantLinear.weight``)."""
    if not isinstance(getattr(type(owner), attr, None), property):
        setattr(owner, attr, v)
        return
    v = v.to(getattr(owner, attr).device)
    for buffer, value in zip(_QUANT_BUFFERS, (v.packed, v.scales_t, v.zeros_t)):
        setattr(owner, buffer, value)


_QUANT_BUFFERS = ("qweight", "scales_t", "zeros_t")  # behind opforge.nn.QuantLinear.weight


def load_into(target: Any, path: Union[str, os.PathLike], **kwargs: Any) -> Dict[str, Any]:
    """``load_safetensors(path, into=target, **kwargs)``: update a module or dict in place, all
    or nothing.

    Example:
        >>> import os, tempfile, torch, opforge
        >>> from opforge.io import load_into
        >>> p = os.path.join(tempfile.mkdtemp(), "m.safetensors")
        >>> opforge.save_safetensors({"weight": torch.ones(2, 3), "bias": torch.zeros(2)}, p)
        >>> m = torch.nn.Linear(3, 2)
        >>> _ = load_into(m, p)
        >>> m.weight.sum().item()
        6.0
    """
    return load_safetensors(path, into=target, **kwargs)
