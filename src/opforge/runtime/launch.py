"""Low-overhead launching of Triton kernels.

``kernel[grid](...)`` re-binds arguments and recomputes the specialization key on every call,
which costs tens of microseconds of host time: more than a small normalization takes on the
GPU. ``TritonLauncher`` computes the same specialization facts Triton uses (argument dtypes,
16-byte alignment of pointers, integers equal to 1 or divisible by 16, 32- vs 64-bit integers,
constexpr values), keeps Triton's compiled kernel per distinct key, and calls its launcher
directly. The first call of each key goes through Triton's own path, which compiles; under
``TRITON_INTERPRET=1`` every call does, since the interpreter has no compiled kernel.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from .backends import triton_interpreting

_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1


def _raw_stream_getter():
    getter = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if getter is None:  # pragma: no cover - older torch
        return lambda index: torch.cuda.current_stream(index).cuda_stream
    return getter


class TritonLauncher:
    """Launch one ``@triton.jit`` kernel, caching its compiled binary per specialization.

    Arguments are passed positionally in the kernel's parameter order, constexprs included.

    Example:
        >>> launcher = TritonLauncher(my_kernel)                        # doctest: +SKIP
        >>> launcher((rows,), (x, y, n, 1024), num_warps=4)              # doctest: +SKIP
    """

    def __init__(self, kernel: Any):
        self.kernel = kernel
        params = getattr(kernel, "params", None)  # the interpreter's wrapper has none
        self._constexpr = tuple(bool(p.is_constexpr) for p in params) if params is not None else ()
        self._compiled: dict[tuple, Any] = {}
        self._hooks = None
        self._stream = None
        self.fast_path = False  # becomes True once a compiled kernel has been launched directly

    def _key(self, args: Sequence[Any], num_warps: int, num_stages: int) -> tuple:
        key: list[Any] = [num_warps, num_stages]
        for arg, is_constexpr in zip(args, self._constexpr):
            if is_constexpr:
                key.append(arg)
            elif isinstance(arg, torch.Tensor):
                key.append((arg.dtype, arg.data_ptr() & 15 == 0, arg.device.index))
            elif isinstance(arg, bool):
                key.append(("b", arg))
            elif isinstance(arg, int):
                key.append((arg == 1, arg & 15 == 0, _I32_MIN <= arg <= _I32_MAX))
            elif isinstance(arg, float):
                key.append("f")
            else:
                key.append(arg)
        return tuple(key)

    def __call__(self, grid: tuple, args: Sequence[Any], num_warps: int = 4, num_stages: int = 2) -> None:
        if triton_interpreting():
            self.kernel[grid](*args, num_warps=num_warps, num_stages=num_stages)
            return
        key = self._key(args, num_warps, num_stages)
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self.kernel[grid](*args, num_warps=num_warps, num_stages=num_stages)
            self._compiled[key] = self._prepare(compiled)
            return
        if compiled is False:  # this triton's compiled kernels cannot be launched directly
            self.kernel[grid](*args, num_warps=num_warps, num_stages=num_stages)
            return
        function, packed, run = compiled
        enter, exit_ = self._hooks.launch_enter_hook, self._hooks.launch_exit_hook
        if enter is not None or exit_ is not None:  # a profiler wants launch metadata: use Triton's path
            self.kernel[grid](*args, num_warps=num_warps, num_stages=num_stages)
            return
        grid_1 = grid[1] if len(grid) > 1 else 1
        grid_2 = grid[2] if len(grid) > 2 else 1
        run(grid[0], grid_1, grid_2, self._stream(torch.cuda.current_device()), function, packed, None,
            None, None, *args)
        self.fast_path = True

    def _prepare(self, compiled: Any) -> Any:
        """Keep what a direct launch needs, or False where this Triton lacks the pieces."""
        try:
            from triton import knobs

            self._hooks = knobs.runtime
            self._stream = _raw_stream_getter()
            return (compiled.function, compiled.packed_metadata, compiled.run)
        except (ImportError, AttributeError):
            return False
