"""Low-overhead launching of Triton kernels.

``kernel[grid](...)`` re-binds arguments and recomputes the specialization key on every call,
which costs tens of microseconds of host time: more than a small normalization takes on the
GPU. ``TritonLauncher`` computes the same specialization facts Triton uses (argument dtypes,
16-byte alignment of pointers, integers equal to 1 or divisible by 16, 32- vs 64-bit integers,
constexpr values), keeps Triton's compiled kernel per distinct key, and calls its launcher
directly. The first call of each key goes through Triton's own path, which compiles; under
``TRITON_INTERPRET=1`` every call does, since the interpreter has no compiled kernel. Calls
through Triton's path take one process-wide lock (``_TRITON_PATH``); direct launches do not.
"""
from __future__ import annotations

import functools
import inspect
import os
import threading
from typing import Any, Callable, Optional, Sequence

import torch

from ..lru import LRU
from ..switches import triton_interpreting

_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1
# OPFORGE_CHECK_LAUNCH_KEYS=1 (set by the GPU test run) checks every caller-supplied key against
# the generic one, so a key that misses part of Triton's specialization fails loudly.
_CHECK_KEYS = os.environ.get("OPFORGE_CHECK_LAUNCH_KEYS", "") not in ("", "0")


def _raw_stream_getter():
    getter = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if getter is None:  # pragma: no cover - older torch
        return lambda index: torch.cuda.current_stream(index).cuda_stream
    return getter


_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device

# Triton's own launch path is not safe from several threads at once: it builds each new kernel's C
# launcher as a module named ``__triton_launcher`` and loads it, and its per-device caches are
# filled without a lock. On an H100, eight threads making first calls of the norm, softmax and
# activation kernels at once had one call fail in the launcher with "function takes exactly 37
# arguments (29 given)": another kernel's argument count. So every call through that path (first
# calls, which compile; calls a profiler hook watches; a Triton without direct launches) holds
# this lock. A compiled kernel's direct launches, the common case, take no lock.
_TRITON_PATH = threading.RLock()


def cdiv(a: int, b: int) -> int:
    """Ceiling division. (``triton.cdiv`` is a constexpr function: ~7 us per call from Python.)"""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (n >= 1), in plain Python for host-side launch code."""
    return 1 << (n - 1).bit_length()


I32_MAX = _I32_MAX


def int_spec(v: int) -> int:
    """Triton's specialization class of an integer argument, as one small int for launch keys:
    equal to 1, divisible by 16, beyond int32.

    Example:
        >>> int_spec(1), int_spec(32), int_spec(7), int_spec(2**32)
        (1, 2, 0, 6)
    """
    return (v == 1) | (((v & 15) == 0) << 1) | ((v > _I32_MAX) << 2)


def _spec_tensor(t: torch.Tensor) -> tuple:
    return (t.dtype, t.data_ptr() & 15 == 0)


def _spec_int(v: int) -> tuple:
    return (v == 1, v & 15 == 0, _I32_MIN <= v <= _I32_MAX)


def _spec_unspecialized(v: Any) -> Any:
    return ("n", _I32_MIN <= v <= _I32_MAX) if type(v) is int else _SPEC.get(type(v), _spec_other)(v)


def _spec_other(v: Any) -> Any:
    if isinstance(v, torch.Tensor):  # a subclass (nn.Parameter): never the tensor itself in a key
        return _spec_tensor(v)
    return type(v) if isinstance(v, float) else v


_SPEC = {torch.Tensor: _spec_tensor, int: _spec_int, bool: lambda v: ("b", v), float: _spec_other}


def descriptor_spec(d: Any) -> tuple:
    """Triton's specialization of a host tensor descriptor (``TensorDescriptor``), for launch keys:
    its element type, rank, block shape and padding (shape and strides are launch-time values).

    Example:
        >>> from triton.tools.tensor_descriptor import TensorDescriptor
        >>> descriptor_spec(TensorDescriptor.from_tensor(torch.zeros(4, 64), [2, 64]))
        ('desc', torch.float32, (2, 64), 'zero', False)
    """
    # fields a Triton release may lack (padding, float32 rounding) read as their defaults
    return ("desc", d.base.dtype, tuple(d.block_shape), getattr(d, "padding", "zero"),
            getattr(d, "round_f32_to_tf32", False))


try:   # descriptors' keys: never the descriptor itself (its equality compares tensors)
    from triton.tools.tensor_descriptor import TensorDescriptor as _TensorDescriptor
    _SPEC[_TensorDescriptor] = descriptor_spec
except ImportError:   # pragma: no cover - a Triton without host tensor descriptors
    pass


def _hook_active(hook: Any) -> bool:
    """Triton >= 3.5 keeps launch hooks in (usually empty) chains; older ones use None."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return bool(calls) if calls is not None else True


class TritonLauncher:
    """Launch one ``@triton.jit`` kernel, caching its compiled binary per specialization.

    Arguments are passed positionally in the kernel's parameter order, constexprs included.

    Example:
        >>> launcher = TritonLauncher(my_kernel)                        # doctest: +SKIP
        >>> launcher((rows,), (x, y, n, 1024), num_warps=4)              # doctest: +SKIP
    """

    def __init__(self, kernel: Any):
        self.kernel = kernel
        params = getattr(kernel, "params", None)
        # Under TRITON_INTERPRET=1 the decorator returns an interpreted function: no params, no binary.
        self.interpreted = params is None or triton_interpreting()
        self._constexpr = tuple(bool(p.is_constexpr) for p in params) if params is not None else ()
        # a constexpr named PDL that is True: compile and launch with programmatic dependent launch
        # (runtime/triton/pdl.py); the compiled binary then carries the launch attribute itself
        names = [getattr(p, "name", None) for p in params] if params is not None else []
        self._pdl_at = names.index("PDL") if "PDL" in names else None
        # do_not_specialize integers: Triton keeps only their type (int32 or int64), not ==1 or %16
        self._unspecialized = tuple(bool(getattr(p, "do_not_specialize", False)) and not p.is_constexpr
                                    for p in params) if params is not None else ()
        self._compiled: LRU[tuple, Any] = LRU(256, "launch.compiled")  # binaries per specialization key
        self._generic_of: LRU[tuple, tuple] = LRU(4096, "launch.keys_checked")
        self._hooks: Any = None
        self._stream = _raw_stream_getter()
        self.fast_path = False  # becomes True once a compiled kernel has been launched directly

    def _key(self, args: Sequence[Any], num_warps: int, num_stages: int) -> tuple:
        spec = _SPEC
        return (num_warps, num_stages, args[0].device.index) + tuple(
            a if c else _spec_unspecialized(a) if u else spec.get(type(a), _spec_other)(a)  # constexprs by value
            for a, c, u in zip(args, self._constexpr, self._unspecialized))

    def __call__(self, grid: tuple, args: Sequence[Any], num_warps: int = 4, num_stages: int = 2,
                 key: Optional[tuple] = None) -> None:
        """Launch on ``grid``. ``key``, if given, must determine Triton's specialization of ``args``
        (the caller vouches for it, which saves computing the generic key); None means generic."""
        if self.interpreted:
            self.kernel[grid](*args, num_warps=num_warps, num_stages=num_stages)
            return
        index = args[0].device.index
        if index != _current_device():  # compile and launch in the tensors' device context
            with torch.cuda.device(index):
                self._launch(grid, args, num_warps, num_stages, None)
            return
        self._launch(grid, args, num_warps, num_stages, key)

    def _launch(self, grid: tuple, args: Sequence[Any], num_warps: int, num_stages: int,
                key: Optional[tuple]) -> None:
        if key is None or _CHECK_KEYS:
            generic = self._key(args, num_warps, num_stages)
            if key is None:
                key = generic
            elif self._generic_of.setdefault(key, generic) != generic:
                raise AssertionError(f"launch key {key} stands for two specializations: "
                                     f"{self._generic_of.get(key)} and {generic}")
        compiled = self._compiled.get(key)
        pdl = self._pdl_at is not None and args[self._pdl_at] is True
        options = {"launch_pdl": True} if pdl else {}
        if compiled is None:
            with _TRITON_PATH:
                compiled = self._compiled.get(key)   # another thread may have compiled it meanwhile
                if compiled is None:
                    compiled = self.kernel[grid](*args, num_warps=num_warps, num_stages=num_stages, **options)
                    self._compiled[key] = self._prepare(compiled, args)
                    return
        if compiled is False or _hook_active(self._hooks.launch_enter_hook) \
                or _hook_active(self._hooks.launch_exit_hook):
            # this Triton's binaries cannot be launched directly, or a profiler wants launch metadata
            with _TRITON_PATH:
                self.kernel[grid](*args, num_warps=num_warps, num_stages=num_stages, **options)
            return
        function, packed, run, tensor_positions = compiled
        # Raw addresses: Triton's launcher would otherwise call data_ptr() and query the driver
        # about every pointer (cuPointerGetAttribute); the op has already checked the devices.
        flat = list(args)
        for i in tensor_positions:
            flat[i] = flat[i].data_ptr()
        run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
            self._stream(args[0].device.index), function, packed, None, None, None, *flat)
        self.fast_path = True

    def launch_raw(self, key: tuple, grid: tuple, raw_args: Sequence[Any], num_warps: int,
                   device_index: int) -> bool:
        """Launch the binary compiled earlier under ``key`` with raw addresses in place of tensors.

        Returns False, doing nothing, when there is none yet (or a profiler hook, the interpreter,
        another current device, or OPFORGE_CHECK_LAUNCH_KEYS asks for the checked path): the
        caller then launches through ``__call__`` with tensors.
        """
        if self.interpreted or _CHECK_KEYS:
            return False
        compiled = self._compiled.get(key)
        if not compiled or not self._direct_ok(device_index):
            return False
        function, packed, run, _ = compiled
        run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
            self._stream(device_index), function, packed, None, None, None, *raw_args)
        self.fast_path = True
        return True

    def raw_launcher(self, key: tuple) -> Optional[Callable[[int, Sequence[Any], int], bool]]:
        """``go(grid_x, raw_args, device_index) -> bool``: ``launch_raw`` on a 1-D grid, bound to the
        binary compiled under ``key`` (what a launch plan keeps), or None if there is none yet.

        Where this Triton's launcher wrapper is one whose work is known to be nothing for this
        kernel (see ``c_launch``), ``go`` calls the C launch function underneath it directly."""
        if self.interpreted or _CHECK_KEYS:
            return None
        compiled = self._compiled.get(key)
        if not compiled:
            return None
        function, packed, run, _ = compiled
        direct_ok, stream = self._direct_ok, self._stream
        call = c_launch(run) or run  # both take run's arguments

        def go(grid_x: int, raw_args: Sequence[Any], device_index: int) -> bool:
            if not direct_ok(device_index):
                return False
            call(grid_x, 1, 1, stream(device_index), function, packed, None, None, None, *raw_args)
            return True
        return go

    def _direct_ok(self, device_index: int) -> bool:
        """A direct launch needs the tensors' device current and no profiler launch hooks."""
        return device_index == _current_device() and not _hook_active(self._hooks.launch_enter_hook) \
            and not _hook_active(self._hooks.launch_exit_hook)

    def _prepare(self, compiled: Any, args: Sequence[Any]) -> Any:
        """Keep what a direct launch needs, or False where this Triton lacks the pieces."""
        try:
            from triton import knobs

            self._hooks = knobs.runtime
            tensor_positions = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
            return (compiled.function, compiled.packed_metadata, compiled.run, tensor_positions)
        except (ImportError, AttributeError):
            return False


# Triton 3.4-3.6's CudaLauncher.__call__ (its body, whitespace collapsed) ends in this call; before
# it, it only allocates global and profile scratch buffers when their sizes are non-zero.
_KNOWN_WRAPPER_SIGNATURE = "def __call__(self, gridX, gridY, gridZ, stream, function, *args):"
_KNOWN_WRAPPER_CALL = ("self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, "
                       "self.launch_pdl, global_scratch, profile_scratch, *args)")


def c_launch(run: Any) -> Optional[Callable[..., None]]:
    """For a compiled kernel's launcher ``run``, a function taking ``run``'s own arguments that
    skips its Python wrapper and calls the C launch function, or None.

    Only where the wrapper is the known one (checked on its source) and the kernel needs no
    scratch buffers, so that the wrapper would pass None, None: it then saves the wrapper's
    ~1 us of Python (two closures, attribute lookups) per launch.

    Example:
        >>> c_launch(object()) is None     # not a Triton launcher: keep calling it as it is
        True
    """
    launch = getattr(run, "launch", None)
    if launch is None or getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1) \
            or not _known_wrapper(type(run)):
        return None
    coop, pdl = run.launch_cooperative_grid, run.launch_pdl

    def call(gx: int, gy: int, gz: int, stream: int, function: Any, *args: Any) -> None:
        launch(gx, gy, gz, stream, function, coop, pdl, None, None, *args)
    return call


@functools.lru_cache(maxsize=None)
def _known_wrapper(cls: type) -> bool:
    try:
        source = " ".join(inspect.getsource(cls.__call__).split())
    except (OSError, TypeError):
        return False
    return source.startswith(_KNOWN_WRAPPER_SIGNATURE) and _KNOWN_WRAPPER_CALL in source
