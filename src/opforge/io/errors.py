"""The one error a bad SafeTensors checkpoint raises."""
from __future__ import annotations

from typing import Optional


class SafetensorsError(ValueError):
    """A SafeTensors file or checkpoint cannot be read as it claims to be.

    Raised for a truncated file, a corrupt header, a tensor whose shape disagrees with its byte
    span or with the model it is loaded into, a missing shard or tensor, an unsupported dtype,
    or a pre-quantized layer in a form opforge cannot represent. The message names the file and
    the tensor.

    Attributes:
        file: the path of the file concerned (``None`` if no single file is).
        tensor: the tensor's name (``None`` if the problem is the file itself).

    Example:
        >>> import opforge
        >>> e = opforge.SafetensorsError("bad header", file="m.safetensors")
        >>> str(e)
        'm.safetensors: bad header'
        >>> isinstance(e, ValueError)
        True
    """

    def __init__(self, message: str, file: Optional[str] = None, tensor: Optional[str] = None):
        self.file = None if file is None else str(file)
        self.tensor = tensor
        where = ": ".join(p for p in (self.file, f"tensor {tensor!r}" if tensor else None) if p)
        super().__init__(f"{where}: {message}" if where else message)


class GGUFError(SafetensorsError):
    """A GGUF file cannot be read as it claims to be, or holds what opforge cannot represent.

    Raised for a wrong magic or version, a truncated file, a tensor whose bytes lie past the end
    of the file, a tensor type or architecture opforge does not know (named). The message names
    the file and the tensor. A sibling of ``SafetensorsError`` (a subclass, so code that catches
    checkpoint errors catches both).

    Example:
        >>> import opforge
        >>> str(opforge.GGUFError("unknown tensor type 99", file="m.gguf", tensor="blk.0.attn_q.weight"))
        "m.gguf: tensor 'blk.0.attn_q.weight': unknown tensor type 99"
    """
