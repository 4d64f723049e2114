"""torch.compile support for the delay pattern: two ops over what a schema can say.

``delays`` is a Python sequence or a tensor, and ``out=`` makes the op write an argument, so
while compiling ``route_*`` calls ``opforge::shift_delay`` (a new output) or
``opforge::shift_delay_out`` (declares ``out`` mutated, returns nothing; the route returns
``out``), with the delays as a ``list[int]`` or a tensor (the other one empty / None).
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from ...runtime.compile_support import library_op


#: The family's public functions, handed over by the package once they exist (``bind``): the
#: custom ops run their ``.eager`` form.
_public: dict[str, Any] = {}


def bind(**functions: Any) -> None:
    """Give this module the family's public functions (the package calls it after defining them)."""
    _public.update(functions)


def _eager(codes: torch.Tensor, delays: list[int], delays_t: Optional[torch.Tensor], bos_id: Optional[int],
           pad_id: int, revert: bool, out: Optional[torch.Tensor]) -> torch.Tensor:
    d = delays_t if delays_t is not None else delays
    if revert:
        return _public["revert_delay"].eager(codes, d, pad_id=pad_id, out=out)
    return _public["apply_delay"].eager(codes, d, bos_id=bos_id, pad_id=pad_id, out=out)


def _shift(codes: torch.Tensor, delays: list[int], delays_t: Optional[torch.Tensor], bos_id: Optional[int],
           pad_id: int, revert: bool) -> torch.Tensor:
    return _eager(codes, delays, delays_t, bos_id, pad_id, revert, None)


def _shift_out(codes: torch.Tensor, delays: list[int], delays_t: Optional[torch.Tensor], bos_id: Optional[int],
               pad_id: int, revert: bool, out: torch.Tensor) -> None:
    _eager(codes, delays, delays_t, bos_id, pad_id, revert, out)


def _fake_shift(codes, delays, delays_t, bos_id, pad_id, revert):
    return codes.new_empty(codes.shape)  # packed


shift_op = library_op("shift_delay", _shift, _fake_shift)
shift_out_op = library_op("shift_delay_out", _shift_out, lambda *a: None, mutates=("out",))


def _route(codes, delays, bos_id, pad_id, revert, out):
    if isinstance(delays, torch.Tensor):
        as_list, as_tensor = [], delays
    else:
        as_list, as_tensor = [int(d) for d in delays], None
    if out is None:
        return shift_op(codes, as_list, as_tensor, bos_id, pad_id, revert)
    shift_out_op(codes, as_list, as_tensor, bos_id, pad_id, revert, out)
    return out


def route_apply_delay(codes, delays, *, bos_id, pad_id, out=None):
    return _route(codes, delays, bos_id, pad_id, False, out)


def route_revert_delay(codes, delays, *, pad_id, out=None):
    return _route(codes, delays, None, pad_id, True, out)
