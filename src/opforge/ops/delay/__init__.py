"""The multi-codebook delay pattern of speech models (Dia, MusicGen-style codecs).

Codebook c of a (B, T, C) code tensor is shifted later in time by ``delays[c]`` steps before
the model sees it (``apply_delay``) and shifted back after generation (``revert_delay``).
Every call validates its arguments, asks the registry for a variant (Triton on CUDA/ROCm,
Metal on MPS, the torch path elsewhere), runs it and, inside ``opforge.trace()``, records it.
"""
from __future__ import annotations

from typing import Optional

import torch

from ...runtime import dispatch
from ...runtime.compile_support import compiled
from . import fakes, reference
from .problem import OPS, Delays, DelayCall, prepare


def _torch_launch(call: DelayCall) -> torch.Tensor:
    sign = 1 if call.problem.op == "apply_delay" else -1
    return reference.shift(call.codes, call.delays, sign, call.fill_before, call.fill_after, call.out)


def _problem_builder(op: str):
    def build(codes, delays, **kwargs):
        if op == "apply_delay":
            return prepare(op, codes, delays, kwargs["bos_id"], kwargs["pad_id"], kwargs.get("out")).problem
        return prepare(op, codes, delays, None, kwargs["pad_id"], kwargs.get("out")).problem

    return build


def _register() -> None:
    dispatch.register_family(OPS, dispatch.kernel_tables(__name__), _torch_launch, "torch gather with masks", _problem_builder)


def _run(op: str, call: DelayCall) -> torch.Tensor:
    if call.codes.numel() == 0:
        return call.out if call.out is not None else torch.empty_like(call.codes)
    return dispatch.run(op, call, call.codes)


@compiled("apply_delay", None, route=fakes.route_apply_delay)
def apply_delay(codes: torch.Tensor, delays: Delays, *, bos_id: int, pad_id: int,
                out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Shift codebook c later by ``delays[c]`` steps: ``out[b, t, c] = codes[b, t - delays[c], c]``.

    ``bos_id`` fills the first ``delays[c]`` steps of codebook c. (``pad_id`` would fill steps
    whose source lies past T, which only a negative delay gives: refused for Python and CPU
    delays; see below.)

    Args:
        codes: (B, T, C) int32 or int64, any strides (read in place).
        delays: C delays >= 0: a sequence of ints (turned into a small device tensor once per
            distinct tuple, then cached), or an integer tensor. A tensor already on the codes'
            GPU is used as is, without reading its values (no host sync): a negative delay there
            is not refused, and gives ``pad_id`` where the source lies past T.
        bos_id, pad_id: fill ids, within the codes' dtype.
        out: optional (B, T, C) tensor of codes' dtype and device (any strides), not
            overlapping codes; written and returned.

    Returns:
        ``out``, or a new packed tensor.

    Example:
        >>> import torch, opforge
        >>> codes = torch.arange(1, 9).view(1, 4, 2)          # T=4, C=2
        >>> opforge.apply_delay(codes, [0, 1], bos_id=-1, pad_id=-2)[0].tolist()
        [[1, -1], [3, 2], [5, 4], [7, 6]]
    """
    return _run("apply_delay", prepare("apply_delay", codes, delays, bos_id, pad_id, out))


@compiled("revert_delay", None, route=fakes.route_revert_delay)
def revert_delay(codes: torch.Tensor, delays: Delays, *, pad_id: int,
                 out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Undo ``apply_delay``: ``out[b, t, c] = codes[b, t + delays[c], c]``, ``pad_id`` where
    ``t + delays[c] >= T``.

    ``revert_delay(apply_delay(x, d, ...), d, ...)`` gives back x wherever ``t + d_c < T``.
    Same arguments as ``apply_delay`` (no ``bos_id``).

    Example:
        >>> import torch, opforge
        >>> codes = torch.arange(1, 9).view(1, 4, 2)
        >>> delayed = opforge.apply_delay(codes, [0, 1], bos_id=-1, pad_id=-2)
        >>> opforge.revert_delay(delayed, [0, 1], pad_id=-2)[0].tolist()
        [[1, 2], [3, 4], [5, 6], [7, -2]]
    """
    return _run("revert_delay", prepare("revert_delay", codes, delays, None, pad_id, out))


fakes.bind(apply_delay=apply_delay, revert_delay=revert_delay)
_register()

__all__ = ["apply_delay", "revert_delay"]
