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
from typing import Any, Dict, Mapping, Optional, Union

import torch

QUANT_SEP = "/"
META_QUANTIZED = "opforge.quantized"
META_FORMAT = "opforge.format"


def _quantized_type():
    try:
        from ..ops.quant import QuantizedWeight
    except ImportError:  # the quant family is not installed: no value can be one
        return None
    return QuantizedWeight


def _host(t: torch.Tensor, seen: set) -> torch.Tensor:
    t = t.detach().to("cpu").contiguous()
    if t.numel() and t.untyped_storage().data_ptr() in seen:
        t = t.clone()  # safetensors refuses tensors that share memory
    if t.numel():
        seen.add(t.untyped_storage().data_ptr())
    return t


def _json_value(v: Any) -> Any:
    if isinstance(v, torch.dtype):
        return {"dtype": str(v).replace("torch.", "")}
    if isinstance(v, (tuple, list)):
        return [_json_value(x) for x in v]
    return v


def save_safetensors(state: Mapping[str, Any], path: Union[str, os.PathLike],
                     metadata: Optional[Mapping[str, str]] = None) -> None:
    """Write ``state`` (tensors and ``QuantizedWeight`` values) to one ``.safetensors`` file.

    Tensors are moved to the CPU and made contiguous; tensors sharing memory are copied. See
    this module's docstring for the key scheme of quantized weights; any reader of SafeTensors
    can open the file, and ``opforge.load_safetensors`` reads it back exactly.

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
    from safetensors.torch import save_file

    qtype = _quantized_type()
    flat: Dict[str, torch.Tensor] = {}
    quantized: Dict[str, Dict[str, Any]] = {}
    seen: set = set()
    for key, value in state.items():
        if not isinstance(key, str):
            raise TypeError(f"state keys must be strings, got {key!r}")
        if qtype is not None and isinstance(value, qtype):
            if QUANT_SEP in key:
                raise ValueError(f"{key!r}: keys of quantized weights may not contain {QUANT_SEP!r}")
            fields: Dict[str, Any] = {}
            for field, v in value.state_dict().items():
                if isinstance(v, torch.Tensor):
                    flat[f"{key}{QUANT_SEP}{field}"] = _host(v, seen)
                else:
                    fields[field] = _json_value(v)
            quantized[key] = fields
        elif isinstance(value, torch.Tensor):
            flat[key] = _host(value, seen)
        else:
            raise TypeError(f"state[{key!r}] must be a torch.Tensor or QuantizedWeight, got {type(value).__name__}")
    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    reserved = [k for k in meta if k.startswith("opforge.")]
    if reserved:
        raise ValueError(f"metadata keys starting with 'opforge.' are reserved, got {reserved}")
    meta[META_FORMAT] = "1"
    if quantized:
        meta[META_QUANTIZED] = json.dumps(quantized, sort_keys=True)
    save_file(flat, str(path), metadata=meta)
