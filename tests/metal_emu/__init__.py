"""An emulator for Metal compute kernels: run unchanged `.metal` files on the CPU.

`compile_shader(source)` mirrors `torch.mps.compile_shader`: it returns a
library whose attributes are kernels, called as
`lib.kernel_name(*args, threads=..., group_size=...)` on CPU tensors.

Calling convention (the same as torch's MPS shader libraries):
  * positional argument i binds to `[[buffer(i)]]`;
  * a tensor is bound at its storage offset, with no dtype or layout check;
  * a Python int is passed as a 64-bit integer, a float as a 32-bit float, a
    list of ints/floats as an array of those; `arg_casts={i: "int32"}` etc.
    changes the width of argument i;
  * `threads` is the total thread count (int or up to 3 dims), `group_size`
    the threads per threadgroup; a ragged last threadgroup is allowed.

Stricter than a GPU, on purpose:
  * threadgroup memory starts as 0xFF bytes (NaN) in every threadgroup;
  * each tensor's storage is copied into a buffer with 0xFF guard bytes on both
    sides: reads past the end see NaN, writes past the end raise an error;
  * a barrier some threads skip, or threads waiting at different barriers,
    raise an error instead of hanging or silently passing.

See README.md in this folder for the design and its limits.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from ._build import build, cache_dir, compiler
from ._source import Kernel

__all__ = [
    "EmulatedKernel",
    "EmulatedLibrary",
    "EmulatorError",
    "available",
    "cache_dir",
    "compile_file",
    "compile_shader",
    "schedule",
]

GUARD_BYTES = 256
MAX_THREADS_PER_THREADGROUP = 1024
SIMD_WIDTH = 32

_SCHEDULES = {"forward": 0, "reverse": 1}
_CASTS = {
    "fp32": ("f", 4), "float": ("f", 4), "float32": ("f", 4),
    "fp16": ("e", 2), "half": ("e", 2), "float16": ("e", 2),
    "bf16": ("bf16", 2), "bfloat16": ("bf16", 2),
    "int64": ("q", 8), "int32": ("i", 4), "int16": ("h", 2), "int8": ("b", 1),
    "uint64": ("Q", 8), "uint32": ("I", 4), "uint16": ("H", 2), "uint8": ("B", 1),
    "bool": ("?", 1),
}
_state = threading.local()


class EmulatorError(RuntimeError):
    """A kernel did something the emulator detects as a bug (see module doc)."""


class _Entry(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("invoke", ctypes.c_void_p),
        ("fn", ctypes.c_void_p),
        ("specs", ctypes.c_void_p),
        ("nparams", ctypes.c_int),
    ]


def available() -> bool:
    """True when a C++ compiler for the emulator is present."""
    return compiler() is not None


def _current_schedule() -> int:
    name = getattr(_state, "schedule", None) or os.environ.get("OPFORGE_METAL_EMU_SCHEDULE", "forward")
    if name not in _SCHEDULES:
        raise ValueError(f"unknown emulator schedule {name!r}; use one of {sorted(_SCHEDULES)}")
    return _SCHEDULES[name]


def _workers() -> int:
    env = os.environ.get("OPFORGE_METAL_EMU_WORKERS")
    return int(env) if env else max(1, min(4, os.cpu_count() or 1))


@contextlib.contextmanager
def schedule(order: str) -> Iterator[None]:
    """Run kernels in this block with fibers picked lowest-first ("forward",
    the default) or highest-first ("reverse")."""
    if order not in _SCHEDULES:
        raise ValueError(f"unknown emulator schedule {order!r}")
    previous = getattr(_state, "schedule", None)
    _state.schedule = order
    try:
        yield
    finally:
        _state.schedule = previous


def _dims(value: int | Sequence[int], what: str) -> tuple[int, int, int]:
    dims = (int(value),) if isinstance(value, int) else tuple(int(v) for v in value)
    if not 1 <= len(dims) <= 3 or any(d < 0 for d in dims):
        raise ValueError(f"{what} must be a non-negative int or 1-3 of them, got {value!r}")
    return (dims + (1, 1))[:3]  # type: ignore[return-value]


def _scalar_bytes(value: Any, cast: str | None) -> bytes:
    import struct

    if isinstance(value, (list, tuple)):
        return b"".join(_scalar_bytes(v, cast) for v in value)
    if cast is None:
        cast = "float32" if isinstance(value, float) else "int64"
    if cast not in _CASTS:
        raise ValueError(f"unsupported arg_casts entry {cast!r}")
    fmt, _ = _CASTS[cast]
    if fmt == "bf16":
        return torch.tensor([float(value)], dtype=torch.bfloat16).view(torch.int16).numpy().tobytes()
    return struct.pack("<" + fmt, value)


def _arena(nbytes: int) -> int:
    """Address of a reusable byte buffer of at least `nbytes` (one per host thread).

    Reusing it matters: fresh large allocations are page-faulted on every call.
    """
    buf = getattr(_state, "arena", None)
    if buf is None or len(buf) < nbytes:
        buf = ctypes.create_string_buffer(max(nbytes, 2 * (0 if buf is None else len(buf)), 1 << 16))
        _state.arena = buf
    return ctypes.addressof(buf)


class _GuardedStorage:
    """A copy of one storage's bytes from `start` on, between two guard zones.

    At `base` in the arena: [guard | copy of the storage | guard], the copy
    placed at the same alignment modulo 64 as the original bytes.  Plain
    memmove/memset: no torch dispatch (and no thread pool) on this path.
    """

    def __init__(self, tensor: torch.Tensor, start: int, base: int):
        storage = tensor.untyped_storage()
        self.src = storage.data_ptr() + start
        self.start = start
        self.size = storage.nbytes() - start
        self.lo = base + GUARD_BYTES + (self.src - (base + GUARD_BYTES)) % 64
        self.hi = self.lo + self.size
        self.base = base
        ctypes.memset(base, 0xFF, self.lo - base)
        ctypes.memset(self.hi, 0xFF, GUARD_BYTES)
        ctypes.memmove(self.lo, self.src, self.size)

    @staticmethod
    def footprint(size: int) -> int:
        return size + 2 * GUARD_BYTES + 64

    def pointer(self, byte_offset: int) -> int:
        return self.lo + (byte_offset - self.start)

    def finish(self, arg_index: int) -> None:
        before = ctypes.string_at(self.base, self.lo - self.base)
        after = ctypes.string_at(self.hi, GUARD_BYTES)
        if before.count(0xFF) != len(before) or after.count(0xFF) != len(after):
            raise EmulatorError(
                f"the kernel wrote outside the storage bound to buffer({arg_index}) "
                f"({self.size} bytes from the tensor's offset on)"
            )
        ctypes.memmove(self.src, self.lo, self.size)


class _Binding:
    """The buffer pointers of one launch.

    Tensors are bound through guarded copies, one per storage (so arguments that alias
    still alias), at their storage offsets; scalars through small byte buffers.
    """

    def __init__(self, args: Sequence[Any], casts: dict[int, str]):
        self.pointers = (ctypes.c_void_p * max(1, len(args)))()
        self._scalars: list[Any] = []  # keeps the scalar buffers alive during the launch
        self._storages: dict[int, tuple[_GuardedStorage, int]] = {}
        starts: dict[int, int] = {}
        sizes: dict[int, int] = {}
        for a in args:
            if isinstance(a, torch.Tensor):
                key = a.untyped_storage().data_ptr()
                off = a.storage_offset() * a.element_size()
                starts[key] = min(off, starts.get(key, off))
                sizes[key] = _GuardedStorage.footprint(a.untyped_storage().nbytes() - starts[key])
        base = _arena(sum(sizes.values()))
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                key = a.untyped_storage().data_ptr()
                if key not in self._storages:
                    self._storages[key] = (_GuardedStorage(a, starts[key], base), i)
                    base += sizes[key]
                storage = self._storages[key][0]
                self.pointers[i] = storage.pointer(a.storage_offset() * a.element_size())
            elif isinstance(a, (bool, int, float, list, tuple)):
                buf = ctypes.create_string_buffer(_scalar_bytes(a, casts.get(i)))
                self._scalars.append(buf)
                self.pointers[i] = ctypes.addressof(buf)
            else:
                raise TypeError(f"argument {i}: cannot pass {type(a).__name__} to a Metal kernel")

    def finish(self) -> None:
        """Check the guard zones and copy every storage back."""
        for storage, first_arg in self._storages.values():
            storage.finish(first_arg)


class EmulatedKernel:
    """One kernel of an emulated library; call it like an MPS shader kernel."""

    max_threads_per_threadgroup = MAX_THREADS_PER_THREADGROUP
    thread_execution_width = SIMD_WIDTH
    static_thread_group_memory_length = 0

    def __init__(self, library: EmulatedLibrary, entry: _Entry, info: Kernel):
        self._library = library
        self._entry = entry
        self.info = info
        self.name = info.name

    def __repr__(self) -> str:
        return f"<EmulatedKernel {self.name}>"

    def __call__(
        self,
        *args: Any,
        threads: int | Sequence[int] | None = None,
        group_size: int | Sequence[int] | None = None,
        arg_casts: dict[int, str] | None = None,
    ) -> None:
        tensors = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        for i, t in tensors:
            if t.device.type != "cpu":
                raise RuntimeError(
                    f"Metal emulator: argument {i} is on {t.device}; the emulator runs on CPU tensors"
                )
        if threads is None:
            if not tensors:
                raise ValueError("threads= is required when no tensor is passed")
            threads = tensors[0][1].numel()
        grid = _dims(threads, "threads")
        if group_size is None:
            group_size = min(MAX_THREADS_PER_THREADGROUP, max(1, grid[0]))
        group = _dims(group_size, "group_size")
        if group[0] * group[1] * group[2] > MAX_THREADS_PER_THREADGROUP:
            raise RuntimeError(
                f"group_size {group} exceeds the kernel's maximum of {MAX_THREADS_PER_THREADGROUP} threads"
            )

        binding = _Binding(args, dict(arg_casts or {}))
        err = ctypes.create_string_buffer(2048)
        rc = self._library._launch(
            ctypes.byref(self._entry), binding.pointers, len(args),
            (ctypes.c_uint32 * 3)(*grid), (ctypes.c_uint32 * 3)(*group),
            _current_schedule(), _workers(), err, len(err),
        )
        if rc != 0:
            raise EmulatorError(f"Metal emulator: kernel {self.name}: {err.value.decode(errors='replace')}")
        binding.finish()


class EmulatedLibrary:
    """The kernels of one MSL source, built for the CPU."""

    def __init__(self, path: Path, kernels: list[Kernel]):
        self._dll = ctypes.CDLL(str(path))
        self._launch = self._dll.emu_launch
        self._launch.restype = ctypes.c_int
        self._launch.argtypes = [
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
            ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int,
        ]
        table = self._dll.emu_kernel_table
        table.restype = ctypes.POINTER(_Entry)
        table.argtypes = [ctypes.POINTER(ctypes.c_int)]
        n = ctypes.c_int()
        entries = table(ctypes.byref(n))
        info = {k.name: k for k in kernels}
        self._kernels: dict[str, EmulatedKernel] = {}
        for i in range(n.value):
            name = entries[i].name.decode()
            self._kernels[name] = EmulatedKernel(self, entries[i], info[name])

    @property
    def kernel_names(self) -> list[str]:
        return sorted(self._kernels)

    def __getattr__(self, name: str) -> EmulatedKernel:
        kernels = self.__dict__.get("_kernels", {})
        if name in kernels:
            return kernels[name]
        raise AttributeError(f"no kernel named {name!r} in this Metal library")

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._kernels))


_libraries: dict[tuple[str, str, int], EmulatedLibrary] = {}
_lock = threading.Lock()


def compile_shader(source: str, filename: str = "source.metal", metal_version: int = 310) -> EmulatedLibrary:
    """Build MSL `source` for the emulator (cached) and return its library.

    Compile errors raise SyntaxError, as `torch.mps.compile_shader` does.
    `metal_version` sets `__METAL_VERSION__` (310 = Metal 3.1, with bfloat).
    """
    key = (source, filename, metal_version)
    with _lock:
        lib = _libraries.get(key)
        if lib is None:
            result = build(source, filename, metal_version)
            lib = EmulatedLibrary(result.path, result.kernels)
            _libraries[key] = lib
        return lib


def compile_file(path: str | os.PathLike[str], metal_version: int = 310) -> EmulatedLibrary:
    """Build a `.metal` file for the emulator and return its library."""
    p = Path(path)
    return compile_shader(p.read_text(), p.name, metal_version)
