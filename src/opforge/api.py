"""opforge's public functions and types, everything but the model runner: what ``opforge``
re-exports, and what :mod:`opforge.models` builds on (it imports this module, not the package,
so the package importing the model runner makes no cycle).

Example:
    >>> import torch
    >>> from opforge import api
    >>> api.rms_norm(torch.ones(2, 8), torch.ones(8)).shape
    torch.Size([2, 8])
"""
from . import fusion, nn
from .fusion import FusionError, UnfusableError, fuse
from .io import GGUFError, SafetensorsError, load_gguf, load_safetensors, save_safetensors
from .fusion import abs, cast, erf, exp, log, maximum, minimum, pow, rsqrt, sigmoid, sqrt, tanh, where  # noqa: A004
from .ops.activation import geglu, gelu, relu, silu, swiglu
from .ops.delay import apply_delay, revert_delay
from .ops.attention import attention, decode_attention
from .ops.paged import paged_attention, paged_kv_cache_append, paged_rotary_kv_cache_append
from .ops.norm import add_layer_norm, add_rms_norm, layer_norm, rms_norm
from .ops.quant import QuantizedWeight, linear, preferred_layout, quantize_weight, repack
from .nn.quant import quantize_model
from .ops.rotary import kv_cache_append, rotary_embedding, rotary_kv_cache_append
from .ops.softmax import log_softmax, softmax
from .runtime.device import DeviceInfo, device_info
from .runtime.device_config import DeviceConfig, device_config
from .runtime.compile_support import InferenceOnlyError
from .runtime.errors import NoKernelError
from .runtime.overlap import AliasedOutputError
from .runtime.policy import FallbackWarning, backend, strict
from .runtime.registry import explain
from .runtime.trace import trace

__all__ = [
    "layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm",
    "softmax", "log_softmax", "gelu", "silu", "relu", "swiglu", "geglu",
    "rotary_embedding", "kv_cache_append", "rotary_kv_cache_append", "apply_delay", "revert_delay",
    "attention", "decode_attention",
    "paged_kv_cache_append", "paged_rotary_kv_cache_append", "paged_attention",
    "device_info", "DeviceInfo", "explain", "trace", "backend", "strict",
    "NoKernelError", "AliasedOutputError", "InferenceOnlyError", "FallbackWarning", "nn",
    "device_config", "DeviceConfig",
    "fuse", "FusionError", "UnfusableError",
    "load_safetensors", "save_safetensors", "SafetensorsError", "load_gguf", "GGUFError",
    "QuantizedWeight", "quantize_weight", "repack", "preferred_layout", "linear", "quantize_model",
    "where", "exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "abs", "minimum", "maximum", "pow", "cast",
]
