"""opforge.models: Llama-family decoders built from opforge's ops, and ``patch`` for transformers.

    model = opforge.models.load("path/to/Llama-3.2-1B", quantize="int4")
    model = opforge.models.load("SmolLM2-135M-Instruct.Q4_1.gguf")    # a GGUF file: its codes, its tokenizer
    out = opforge.generate(model, [prompt_ids], 64, temperature=0.7, top_p=0.9)   # decoding: opforge.serve

Example:
    >>> import torch, opforge
    >>> from opforge.models.testing import write_tiny_checkpoint
    >>> model = opforge.models.load(write_tiny_checkpoint(), device="cpu", dtype=torch.float32, max_seq_len=32)
    >>> model.forward(torch.tensor([[1, 2, 3]])).shape
    torch.Size([1, 3, 64])
"""
from .config import ModelConfig, UnsupportedModelError
from .decoder import Decoder
from .loader import load

__all__ = ["load", "Decoder", "ModelConfig", "UnsupportedModelError"]
