"""Saving state dicts, QuantizedWeight values included, as one SafeTensors file.

Key scheme: a plain tensor is stored under its own key. A ``QuantizedWeight`` stored under key
``k`` becomes one tensor per tensor field of its ``state_dict()``, named ``k/<field>`` (e.g.
``layers.0.mlp.up.weight/qweight``, ``.../scales``, ``.../zeros``); its other fields (``bits``,
``group_size``, ``out_features``, ``in_features``) go into the header metadata under
``opforge.quantized`` as JSON ``{k: {field: value}}``, next to ``opforge.format = "1"``.
``load_safetensors`` rebuilds the ``QuantizedWeight`` from these.
"""
from __future__ import annotations

import json
import os
import struct
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import torch

from .format import CODES

QUANT_SEP = "/"
META_QUANTIZED = "opforge.quantized"
META_FORMAT = "opforge.format"


def _quantized_type():
    try:
        from ..ops.quant import QuantizedWeight
    except ImportError:  # the quant family is not installed: no value can be one
        return None
    return QuantizedWeight


def _flatten(state: Mapping[str, Any]) -> Tuple[List[Tuple[str, torch.Tensor]], Dict[str, Dict[str, Any]]]:
    qtype = _quantized_type()
    flat: List[Tuple[str, torch.Tensor]] = []
    quantized: Dict[str, Dict[str, Any]] = {}
    for key, value in state.items():
        if not isinstance(key, str):
            raise TypeError(f"state keys must be strings, got {key!r}")
        if qtype is not None and isinstance(value, qtype):
            if QUANT_SEP in key:
                raise ValueError(f"{key!r}: keys of quantized weights may not contain {QUANT_SEP!r}")
            fields: Dict[str, Any] = {}
            for field, v in value.state_dict().items():
                if isinstance(v, torch.Tensor):
                    flat.append((f"{key}{QUANT_SEP}{field}", v))
                else:
                    fields[field] = v   # ints (bits, group_size, out_features, in_features)
            quantized[key] = fields
        elif isinstance(value, torch.Tensor):
            flat.append((key, value))
        else:
            raise TypeError(f"state[{key!r}] must be a torch.Tensor or QuantizedWeight, got {type(value).__name__}")
        if flat and flat[-1][1].dtype not in CODES:
            raise TypeError(f"state[{key!r}]: dtype {flat[-1][1].dtype} has no SafeTensors code")
    names = [n for n, _ in flat]
    if len(set(names)) != len(names):
        raise ValueError("two entries flatten to the same tensor name")
    return flat, quantized


def save_safetensors(state: Mapping[str, Any], path: Union[str, os.PathLike],
                     metadata: Optional[Mapping[str, str]] = None) -> None:
    """Write ``state`` (tensors and ``QuantizedWeight`` values) to one ``.safetensors`` file.

    Tensors are written one at a time (a GPU tensor is copied to the host on its turn), so host
    memory grows by one tensor, not the state's size. See this module's docstring for the key
    scheme of quantized weights; any SafeTensors reader can open the file, and
    ``opforge.load_safetensors`` reads it back exactly. The file appears complete or not at all
    (written to a temporary name, then renamed).

    Args:
        state: name -> ``torch.Tensor`` or ``opforge.QuantizedWeight``.
        path: the file to write.
        metadata: extra header strings to store (keys starting ``opforge.`` are reserved).

    Example:
        >>> import os, tempfile, torch, opforge
        >>> p = os.path.join(tempfile.mkdtemp(), "m.safetensors")
        >>> opforge.save_safetensors({"w": torch.arange(4.0)}, p)
        >>> opforge.load_safetensors(p)["w"]
        tensor([0., 1., 2., 3.])
    """
    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    reserved = [k for k in meta if k.startswith("opforge.")]
    if reserved:
        raise ValueError(f"metadata keys starting with 'opforge.' are reserved, got {reserved}")
    flat, quantized = _flatten(state)
    meta[META_FORMAT] = "1"
    if quantized:
        meta[META_QUANTIZED] = json.dumps(quantized, sort_keys=True)
    header: Dict[str, Any] = {"__metadata__": meta}
    offset = 0
    for name, t in flat:
        nbytes = t.numel() * t.element_size()
        header[name] = {"dtype": CODES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    path = str(path)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
            for _, t in flat:
                host = t.detach().to("cpu").contiguous().reshape(-1)
                if host.numel():
                    f.write(memoryview(host.view(torch.uint8).numpy()))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
