"""GGUF files (llama.cpp's format) in: the container through the ``gguf`` package, tensors as
dense torch tensors or ``QuantizedWeight`` (ggml's block formats kept, not requantized).

``open_gguf`` reads and checks the header: metadata and every tensor's type, shape and byte
span, before any tensor is decoded, so a bad file raises ``GGUFError`` (naming the file and the
tensor) and nothing is half-loaded. ``load_gguf`` decodes the tensors:

* F32, F16, BF16 (and F64): dense tensors.
* Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K: ``QuantizedWeight`` holding the file's own
  codes and scales (see ``opforge.io.gguf_blocks`` for the mapping and its exactness).
* Other ggml types the ``gguf`` package can dequantize (Q2_K, Q3_K, the IQ formats...): dense
  float32 tensors (dequantized by ``gguf``; opforge has no kernel for their codes).

Tensors keep their GGUF names and layout (a 2-D tensor is (rows, row length), as the bytes lie);
``opforge.models.load`` maps names and undoes llama.cpp's q/k row order for a model.

Example:
    >>> import os, tempfile, numpy as np, gguf, opforge
    >>> p = os.path.join(tempfile.mkdtemp(), "t.gguf")
    >>> w = gguf.GGUFWriter(p, "llama")
    >>> w.add_tensor("a", np.arange(6, dtype=np.float32).reshape(2, 3))
    >>> w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    >>> opforge.load_gguf(p)["a"]
    tensor([[0., 1., 2.],
            [3., 4., 5.]])
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np
import torch

from ..ops.quant import QuantizedWeight
from .errors import GGUFError
from .gguf_blocks import BLOCKS, decode_blocks

_DENSE = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file: ``shape`` in torch order (the row length last), ``kind`` the
    ggml type's name (``"Q4_1"``), ``data`` its bytes (a read-only numpy view of the file)."""

    name: str
    kind: str
    shape: tuple[int, ...]
    data: np.ndarray


@dataclass
class GGUFFile:
    """A checked GGUF file: ``metadata`` (key -> Python value) and ``tensors`` in file order."""

    path: str
    metadata: dict[str, Any]
    tensors: list[TensorInfo]


def _gguf():
    try:
        import gguf
    except ImportError as e:           # an optional extra
        raise ImportError("reading GGUF files needs the `gguf` package: pip install 'opforge[gguf]'") from e
    return gguf


def _check_tensor(path: str, name: str, raw_type: int, dims: list[int], offset: int, data_start: int,
                  file_size: int) -> None:
    """Raise ``GGUFError`` for a tensor of unknown type, of a shape its blocks don't tile, or
    whose bytes lie past the end of the file."""
    gguf = _gguf()
    try:
        kind = gguf.GGMLQuantizationType(raw_type)
    except ValueError:
        raise GGUFError(f"unknown tensor type {raw_type} (not a ggml type this `gguf` package knows)",
                        path, name) from None
    block, type_size = gguf.GGML_QUANT_SIZES[kind]
    if not dims or any(d <= 0 for d in dims):
        raise GGUFError(f"bad shape {dims}", path, name)
    if dims[0] % block:
        raise GGUFError(f"{kind.name} row length {dims[0]} is not a multiple of its block of {block}", path, name)
    n_bytes = int(np.prod(dims)) // block * type_size
    start = data_start + offset
    if start + n_bytes > file_size:
        raise GGUFError(f"the tensor's bytes [{start}, {start + n_bytes}) lie past the end of the file "
                        f"({file_size} bytes): truncated or corrupt", path, name)


def _checked_reader(path: str):
    gguf = _gguf()
    size = os.path.getsize(path)

    class CheckedReader(gguf.GGUFReader):
        """``gguf``'s reader, checking each tensor's type and span (naming it) before building it."""

        def _build_tensors(self, start_offs: int, fields: list) -> None:
            for field in fields:
                _, name, _, dims, raw_type, offset = field.parts
                _check_tensor(path, str(bytes(name), encoding="utf-8", errors="replace"), int(raw_type[0]),
                              [int(d) for d in dims], int(offset[0]), start_offs, size)
            super()._build_tensors(start_offs, fields)

    return CheckedReader(path)


def open_gguf(path: Union[str, os.PathLike]) -> GGUFFile:
    """Read a GGUF file's metadata and tensor table, checking every tensor's type and span.

    Raises:
        GGUFError: wrong magic, unsupported version, truncated header or data, unknown tensor
            type, a tensor past the end of the file (the file and tensor named).
        FileNotFoundError: no such file.

    Example:
        >>> import os, tempfile, opforge
        >>> from opforge.io.gguf import open_gguf
        >>> p = os.path.join(tempfile.mkdtemp(), "x.gguf")
        >>> _ = open(p, "wb").write(b"GGML" + bytes(20))
        >>> open_gguf(p)
        Traceback (most recent call last):
        ...
        opforge.io.errors.GGUFError: ...x.gguf: not a GGUF file (magic b'GGML', want b'GGUF')
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such GGUF file: {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise GGUFError(f"not a GGUF file (magic {magic!r}, want b'GGUF')", path)
    try:
        reader = _checked_reader(path)
    except GGUFError:
        raise
    except Exception as e:   # the gguf package's own errors: truncated header, bad version, bad field
        raise GGUFError(f"unreadable header ({type(e).__name__}: {e}); truncated or corrupt?", path) from None
    metadata = {}
    for key, field in reader.fields.items():
        try:
            metadata[key] = field.contents()
        except Exception as e:
            raise GGUFError(f"metadata {key!r} unreadable ({e})", path) from None
    tensors = [TensorInfo(t.name, t.tensor_type.name, tuple(int(d) for d in reversed(t.shape.tolist())), t.data)
               for t in reader.tensors]
    return GGUFFile(path, metadata, tensors)


def _quantized(codes: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor], bits: int, group: int,
               info: TensorInfo, path: str) -> QuantizedWeight:
    """Codes (N, K) uint8 in range by construction, packed here without ``from_codes``'
    int32 round trip (int4: two codes a byte, low nibble first; four bytes a little-endian word)."""
    for what, t in (("scales", scales), ("zeros", zeros)):
        if t is not None and not bool(torch.isfinite(t).all()):
            raise GGUFError(f"{info.kind} block {what} hold a non-finite value", path, info.name)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).view(torch.int32) if bits == 4 else codes.contiguous()
    return QuantizedWeight(packed.contiguous(), scales.t().contiguous(),
                           None if zeros is None else zeros.t().contiguous(), bits, group, tuple(codes.shape))


def decode_tensor(info: TensorInfo, path: str = "") -> Union[torch.Tensor, QuantizedWeight]:
    """One tensor on the CPU: dense (in its file dtype; float32 for types decoded by ``gguf``)
    or a ``QuantizedWeight`` for ggml block formats opforge holds (2-D tensors only)."""
    if info.kind in _DENSE:
        raw = torch.from_numpy(np.array(info.data).view(np.uint8).reshape(-1))
        return raw.view(_DENSE[info.kind]).reshape(info.shape).clone()
    if info.kind in BLOCKS and len(info.shape) == 2:
        raw = torch.from_numpy(np.array(info.data, dtype=np.uint8)).reshape(info.shape[0], -1)
        codes, scales, zeros, bits, group = decode_blocks(info.kind, raw, info.shape[1])
        return _quantized(codes, scales, zeros, bits, group, info, path)
    gguf = _gguf()
    try:
        dense = gguf.quants.dequantize(np.array(info.data), gguf.GGMLQuantizationType[info.kind])
    except NotImplementedError:
        raise GGUFError(f"tensor type {info.kind} is not supported (opforge decodes F32, F16, BF16, "
                        f"{', '.join(BLOCKS)}, and what the `gguf` package dequantizes)", path, info.name) from None
    return torch.from_numpy(np.ascontiguousarray(dense, dtype=np.float32)).reshape(info.shape)


def load_gguf(path: Union[str, os.PathLike], device: Union[str, torch.device, None] = None,
              dtype: Optional[torch.dtype] = None) -> dict[str, Union[torch.Tensor, QuantizedWeight]]:
    """Every tensor of a GGUF file, by its GGUF name: dense ``torch.Tensor`` or ``QuantizedWeight``.

    Args:
        path: a ``.gguf`` file.
        device: where the tensors go (default CPU).
        dtype: a float dtype for the dense tensors (default: as stored; types dequantized by the
            ``gguf`` package come as float32). Quantized weights keep their codes and scales.

    Raises:
        GGUFError: a bad file or a tensor type opforge can't decode, naming the file and the
            tensor; raised before any tensor is decoded where the header shows it.

    Example:
        >>> import os, tempfile, numpy as np, gguf, opforge
        >>> p = os.path.join(tempfile.mkdtemp(), "q.gguf")
        >>> w = gguf.GGUFWriter(p, "llama")
        >>> rows = gguf.quants.quantize(np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64),
        ...                             gguf.GGMLQuantizationType.Q8_0)
        >>> w.add_tensor("w", rows, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        >>> w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
        >>> opforge.load_gguf(p)["w"]
        QuantizedWeight(int8, (2, 64), group_size=32, symmetric, scales=float16, 136 bytes, cpu)
    """
    file = open_gguf(path)
    device = torch.device(device) if device is not None else torch.device("cpu")
    if dtype is not None and not dtype.is_floating_point:
        raise ValueError(f"dtype must be a float dtype, got {dtype}")
    out: dict[str, Union[torch.Tensor, QuantizedWeight]] = {}
    for info in file.tensors:
        try:
            t = decode_tensor(info, file.path)
        except GGUFError:
            raise
        except Exception as e:
            raise GGUFError(f"cannot decode {info.kind} tensor of shape {info.shape} ({e})", file.path,
                            info.name) from None
        out[info.name] = t.to(device) if isinstance(t, QuantizedWeight) else t.to(device, dtype or t.dtype)
    return out
