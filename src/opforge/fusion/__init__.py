"""The fusion compiler: ``opforge.fuse`` and the pointwise math usable inside fused functions.

    @opforge.fuse
    def bias_gelu_residual(x, b, r, scale: float):
        return opforge.gelu(x + b) * scale + r

A fused function is traced once per signature with symbolic tensors (no torch.fx, no
torch.compile) into an expression graph, simplified, and compiled into one kernel: Triton on
CUDA (and on CPU through Triton's interpreter), generated torch code elsewhere. See
``fused.py`` for the caches, ``tracer.py``/``symbolic.py`` for what can be traced, and
``codegen_triton.py`` for the kernels.

Example:
    >>> import torch
    >>> from opforge.fusion import fuse, where
    >>> relu6 = fuse(lambda x: where(x > 6, 6.0, where(x < 0, 0.0, x)))
    >>> relu6(torch.tensor([-1.0, 3.0, 9.0])).tolist()
    [0.0, 3.0, 6.0]
"""
from .errors import FusionError, UnfusableError
from .functions import abs, cast, erf, exp, log, maximum, minimum, pow, rsqrt, sigmoid, sqrt, tanh, where
from .fused import CacheInfo, FusedFunction, clear_caches, fuse

__all__ = [
    "fuse", "FusedFunction", "CacheInfo", "clear_caches", "FusionError", "UnfusableError",
    "where", "exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "abs", "minimum", "maximum", "pow", "cast",
]
