"""``torch.nn`` drop-ins backed by opforge kernels."""
from .norm import LayerNorm, RMSNorm

__all__ = ["LayerNorm", "RMSNorm"]
