"""The SafeTensors layout: headers parsed and checked, checkpoints resolved into files.

A SafeTensors file is an 8-byte little-endian header length, a JSON header mapping each tensor
name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the end of the
header) plus an optional ``"__metadata__"`` of strings, then the raw little-endian bytes.
opforge parses the header itself (a few lines) so that it can read each tensor with plain file
reads into buffers it owns: a memory map would count every touched page of the file in the
process's resident memory until the map closes.
"""
from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple, Union

import torch

from .errors import SafetensorsError

MAX_HEADER_BYTES = 100 * 1024 * 1024
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


def _dtype_table() -> Dict[str, torch.dtype]:
    table = {
        "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
        "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
        "U8": torch.uint8, "BOOL": torch.bool,
    }
    optional = {"F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
                "U16": "uint16", "U32": "uint32", "U64": "uint64"}
    for code, name in optional.items():
        if hasattr(torch, name):
            table[code] = getattr(torch, name)
    return table


DTYPES: Dict[str, torch.dtype] = _dtype_table()
CODES: Dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}


@dataclass(frozen=True)
class Entry:
    """One tensor of one file: where its bytes are and what they mean."""

    name: str
    file: str
    dtype: torch.dtype
    shape: Tuple[int, ...]
    begin: int  # absolute byte offset in the file
    nbytes: int


@dataclass
class Header:
    """A parsed, checked header: entries in file order and the metadata strings."""

    file: str
    entries: List[Entry]
    metadata: Dict[str, str]


def read_header(path: Union[str, os.PathLike]) -> Header:
    """Parse and check the header of one SafeTensors file.

    Every tensor's byte span must match its dtype and shape and lie inside the file, and no two
    spans may overlap; otherwise ``SafetensorsError`` names the file and tensor.

    Example:
        >>> import os, tempfile, torch, opforge
        >>> from opforge.io.format import read_header
        >>> p = os.path.join(tempfile.mkdtemp(), "t.safetensors")
        >>> opforge.save_safetensors({"a": torch.ones(2, 3)}, p)
        >>> [(e.name, e.dtype, e.shape, e.nbytes) for e in read_header(p).entries]
        [('a', torch.float32, (2, 3), 24)]
    """
    file = str(path)
    try:
        size = os.path.getsize(file)
        with open(file, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise SafetensorsError(f"file is {size} bytes, too short for a SafeTensors header", file)
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise SafetensorsError(f"corrupt header: length {n} does not fit the file of {size} bytes", file)
            raw = f.read(n)
    except FileNotFoundError:
        raise SafetensorsError("file not found", file) from None
    except IsADirectoryError:
        raise SafetensorsError("is a directory, not a .safetensors file", file) from None
    try:
        table = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"corrupt header: not JSON ({e})", file) from None
    if not isinstance(table, dict):
        raise SafetensorsError("corrupt header: not a JSON object", file)
    metadata = table.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise SafetensorsError("corrupt header: __metadata__ is not an object", file)
    data_start = 8 + n
    entries = [_entry(file, name, info, data_start, size) for name, info in table.items()]
    entries.sort(key=lambda e: e.begin)
    for a, b in zip(entries, entries[1:]):
        if b.begin < a.begin + a.nbytes:
            raise SafetensorsError(f"corrupt header: its bytes overlap those of {a.name!r}", file, b.name)
    return Header(file, entries, {str(k): str(v) for k, v in metadata.items()})


def _entry(file: str, name: str, info: object, data_start: int, size: int) -> Entry:
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
        raise SafetensorsError("corrupt header: entry lacks dtype, shape or data_offsets", file, name)
    code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if code not in DTYPES:
        raise SafetensorsError(f"unsupported dtype {code!r} (supported: {', '.join(DTYPES)})", file, name)
    if (not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape)
            or not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and o >= 0 for o in offsets) or offsets[1] < offsets[0]):
        raise SafetensorsError(f"corrupt header: bad shape {shape!r} or data_offsets {offsets!r}", file, name)
    dtype = DTYPES[code]
    nbytes = math.prod(shape) * dtype.itemsize
    if offsets[1] - offsets[0] != nbytes:
        raise SafetensorsError(
            f"shape {tuple(shape)} of {code} needs {nbytes} bytes but its data_offsets span "
            f"{offsets[1] - offsets[0]}", file, name)
    begin = data_start + offsets[0]
    if begin + nbytes > size:
        raise SafetensorsError(
            f"truncated file: the tensor ends at byte {begin + nbytes} but the file has {size}", file, name)
    return Entry(name, file, dtype, tuple(shape), begin, nbytes)


def checkpoint_files(path: Union[str, os.PathLike]) -> Tuple[List[str], Dict[str, str], Path]:
    """Resolve a checkpoint path into its files, the tensor-to-file map of its index (if any),
    and the folder that may hold ``config.json``.

    ``path`` is one ``.safetensors`` file, a ``model.safetensors.index.json``, or a folder with
    either an index (sharded checkpoint) or a single ``model.safetensors``.

    Example:
        >>> import os, tempfile, torch, opforge
        >>> from opforge.io.format import checkpoint_files
        >>> d = tempfile.mkdtemp()
        >>> opforge.save_safetensors({"a": torch.ones(2)}, os.path.join(d, "model.safetensors"))
        >>> files, index, folder = checkpoint_files(d)
        >>> [os.path.basename(f) for f in files], index
        (['model.safetensors'], {})
    """
    p = Path(path)
    if p.is_dir():
        if (p / INDEX_NAME).is_file():
            return _indexed(p / INDEX_NAME)
        if (p / SINGLE_NAME).is_file():
            return [str(p / SINGLE_NAME)], {}, p
        raise SafetensorsError(f"the folder holds neither {INDEX_NAME} nor {SINGLE_NAME}", str(p))
    if p.name.endswith(".json"):
        return _indexed(p)
    if not p.exists():
        raise SafetensorsError("file not found", str(p))
    return [str(p)], {}, p.parent


def _indexed(index_path: Path) -> Tuple[List[str], Dict[str, str], Path]:
    try:
        index = json.loads(index_path.read_text())
        weight_map = index["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except FileNotFoundError:
        raise SafetensorsError("index file not found", str(index_path)) from None
    except (ValueError, KeyError, TypeError) as e:
        raise SafetensorsError(f"corrupt index: {e}", str(index_path)) from None
    folder = index_path.parent
    files: List[str] = []
    for name, shard in weight_map.items():
        f = str(folder / shard)
        if f not in files:
            if not os.path.isfile(f):
                raise SafetensorsError(f"missing shard, listed in {index_path.name} for this tensor", f, name)
            files.append(f)
    return files, {name: str(folder / shard) for name, shard in weight_map.items()}, folder
