"""opforge: verified, fast GPU kernels for transformer inference on PyTorch tensors.

Example:
    >>> import torch, opforge
    >>> with opforge.trace() as t:
    ...     y = opforge.layer_norm(torch.randn(4, 256))
    >>> t[0].backend
    'torch'
"""
from . import api
from .api import *  # noqa: F401,F403  (the public functions and types)
from . import models  # noqa: E402  (after the ops it builds on)
from .models.patch import patch  # noqa: E402
from .serve.generate import generate  # noqa: E402  (a batch of prompts on the serving engine)

__version__ = "0.1.0"

__all__ = [*api.__all__, "models", "patch", "generate"]
