"""``torch.nn`` drop-ins backed by opforge kernels."""
from .norm import LayerNorm, RMSNorm
from .quant import QuantLinear, Replaced, quantize_model

__all__ = ["LayerNorm", "RMSNorm", "QuantLinear", "Replaced", "quantize_model"]
