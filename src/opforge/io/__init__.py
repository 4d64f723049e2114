"""Checkpoints in and out: ``load_safetensors`` streams tensor by tensor onto a device
(converting, quantizing, importing GPTQ/AWQ layers), ``save_safetensors`` writes state dicts
that hold ``QuantizedWeight`` values, ``load_gguf`` reads llama.cpp's GGUF files (needs the
``gguf`` package: ``pip install 'opforge[gguf]'``).

Example:
    >>> import os, tempfile, torch, opforge
    >>> p = os.path.join(tempfile.mkdtemp(), "m.safetensors")
    >>> opforge.save_safetensors({"a": torch.ones(3)}, p)
    >>> opforge.load_safetensors(p)["a"]
    tensor([1., 1., 1.])
"""
from .errors import GGUFError, SafetensorsError
from .gguf import load_gguf
from .load import load_into, load_safetensors
from .save import save_safetensors

__all__ = ["load_safetensors", "save_safetensors", "load_into", "load_gguf", "SafetensorsError", "GGUFError"]
