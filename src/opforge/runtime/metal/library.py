"""Metal shader libraries: each ``.metal`` source is compiled once per process.

On MPS tensors a source goes through ``torch.mps.compile_shader`` (torch >= 2.7); its kernels
are called as ``lib.kernel_name(*args, threads=..., group_size=...)``, where positional
argument i binds to ``[[buffer(i)]]``, a Python int is passed as a 64-bit integer and a float
as a 32-bit float, and a tensor is bound at its storage offset with no dtype or layout check
(launchers check those). Compile errors surface as ``SyntaxError``.

With ``OPFORGE_METAL_EMULATE=1`` the same sources run on CPU tensors in the MSL emulator,
which lives with the tests (``tests/metal_emu``), not in the installed package. It is found,
in this order:

1. an emulator installed with ``set_emulator(compile_fn)`` (the tests' conftest does this);
2. the folder named by ``OPFORGE_METAL_EMULATOR`` (a path to a ``metal_emu`` folder);
3. ``tests/metal_emu`` of the source checkout this package runs from (``pip install -e``),
   which is how ``opforge verify`` finds it.

``compile_fn(source, filename)`` must return an object with the same calling convention as
``torch.mps.compile_shader``'s libraries.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Optional

import torch

from ..lru import LRU
from ..switches import metal_emulating

CompileFn = Callable[[str, str], Any]

_emulator: Optional[CompileFn] = None
_libraries: LRU[tuple[str, str], Any] = LRU(64, "metal.libraries")
_lock = threading.Lock()


def set_emulator(compile_fn: Optional[CompileFn]) -> None:
    """Install (or, with None, remove) the function that builds sources for the CPU emulator."""
    global _emulator
    _emulator = compile_fn
    with _lock:
        for key in [k for k in _libraries.keys() if k[1] == "emulated"]:
            _libraries.pop(key)


def _checkout_emulator_dir() -> Optional[Path]:
    env = os.environ.get("OPFORGE_METAL_EMULATOR")
    if env:
        return Path(env)
    # src/opforge/runtime/metal/library.py -> the repository root is four folders above "metal"
    candidate = Path(__file__).resolve().parents[4] / "tests" / "metal_emu"
    return candidate if (candidate / "__init__.py").is_file() else None


def _load_emulator_module(folder: Path) -> ModuleType:
    if "metal_emu" in sys.modules:
        return sys.modules["metal_emu"]
    spec = importlib.util.spec_from_file_location(
        "metal_emu", folder / "__init__.py", submodule_search_locations=[str(folder)])
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load the Metal emulator from {folder}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["metal_emu"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["metal_emu"]
        raise
    return module


def emulator() -> CompileFn:
    """The emulator's compile function; ``RuntimeError`` saying why if there is none."""
    if _emulator is not None:
        return _emulator
    reason = emulator_unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    folder = _checkout_emulator_dir()
    assert folder is not None
    return _load_emulator_module(folder).compile_shader


def emulator_unavailable_reason() -> Optional[str]:
    """Why the CPU emulator cannot run here (no emulator found, no g++), or None if it can."""
    if _emulator is not None:
        return None
    folder = _checkout_emulator_dir()
    if folder is None or not (folder / "__init__.py").is_file():
        return ("the Metal emulator was not found: it lives in tests/metal_emu of a source checkout "
                "(install opforge with pip install -e, or set OPFORGE_METAL_EMULATOR to that folder)")
    try:
        module = _load_emulator_module(folder)
    except Exception as exc:  # a broken checkout: say so instead of failing later
        return f"the Metal emulator in {folder} failed to load: {exc}"
    if not module.available():
        return "the Metal emulator needs a C++20 compiler (g++) on PATH"
    return None


def library(path: Path, device_type: str) -> Any:
    """The compiled library of the ``.metal`` file at ``path``, for ``device_type`` tensors.

    ``device_type`` is ``"mps"`` (``torch.mps.compile_shader``) or ``"cpu"`` (the emulator,
    only while ``OPFORGE_METAL_EMULATE=1``). Compiled once per process and mode.
    """
    mode = "emulated" if device_type == "cpu" else "mps"
    key = (str(path), mode)
    lib = _libraries.get(key)
    if lib is not None:
        return lib
    if mode == "emulated" and not metal_emulating():
        raise RuntimeError("Metal kernels run on CPU tensors only with OPFORGE_METAL_EMULATE=1")
    if mode == "mps" and device_type != "mps":
        raise RuntimeError(f"Metal kernels do not run on {device_type} tensors")
    source = Path(path).read_text()
    with _lock:
        lib = _libraries.get(key)
        if lib is None:
            if mode == "emulated":
                lib = emulator()(source, Path(path).name)
            else:
                lib = torch.mps.compile_shader(source)
            _libraries[key] = lib
    return lib


def kernel(path: Path, name: str, device_type: str) -> Any:
    """One kernel of ``library(path, device_type)``; ``RuntimeError`` if it has none of that name."""
    lib = library(path, device_type)
    try:
        return getattr(lib, name)
    except Exception as exc:  # torch's libraries raise RuntimeError for an unknown name
        raise RuntimeError(f"{Path(path).name} has no kernel {name!r} here ({exc})") from None


SIMD_WIDTH = 32
MAX_GROUP = 1024                 # threads per threadgroup on Apple GPUs
TYPE_NAMES = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat"}  # MSL spelling


def check_rows_binding(name: str, t: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Kernels bind raw storage: refuse a tensor whose dtype, device or last stride is wrong."""
    if t.dtype != dtype or t.device != device or (t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1):
        raise RuntimeError(f"metal launcher: {name} must be {dtype} on {device} with a contiguous last "
                           f"dimension, got {t.dtype} on {t.device} with strides {t.stride()}")
    return t


def row_group_config(variant: str, n: int, rows: int, max_threads: int, rows_per_group: int,
                     row_reads: int) -> tuple[int, int]:
    """(threads per threadgroup, rows per threadgroup) of a row kernel at row length ``n``.

    ``multirow``: one simdgroup per row, up to ``rows_per_group`` rows; ``row``: one threadgroup
    holding ``row_reads`` elements per thread (an error if that needs more than ``max_threads``);
    anything else (``looped``): one threadgroup per row, as wide as allowed.
    """
    if variant == "multirow":
        per_group = max(1, min(rows_per_group, rows, max_threads // SIMD_WIDTH))
        return SIMD_WIDTH * per_group, per_group
    threads = -(-n // row_reads)
    want = max(SIMD_WIDTH, -(-threads // SIMD_WIDTH) * SIMD_WIDTH)
    if variant == "row":
        if want > max_threads:
            raise RuntimeError(f"metal.row needs {want} threads per threadgroup for N={n}, "
                               f"but this pipeline allows {max_threads}")
        return want, 1
    return min(want, MAX_GROUP, max_threads // SIMD_WIDTH * SIMD_WIDTH), 1


def launch_rows(fn: Any, rows: int, group: int, rows_per_group: int, max_threads_per_launch: int,
                *args: Any) -> None:
    """Dispatch ``fn(*args, first_row)`` over ``rows`` rows, in launches of at most
    ``max_threads_per_launch`` threads (the kernels take the first row of each launch last)."""
    rows_per_launch = max(1, max_threads_per_launch // group) * rows_per_group
    for base in range(0, rows, rows_per_launch):
        groups = -(-min(rows_per_launch, rows - base) // rows_per_group)
        fn(*args, base, threads=groups * group, group_size=group)


def bfloat_reason(dtype: torch.dtype, device_type: str, path: Path, probe_kernel: str) -> Optional[str]:
    """On an MPS device, why bfloat kernels cannot run (Metal before 3.1 compiles none), else None.

    ``probe_kernel`` names one bfloat kernel of ``path``; whether it compiled is asked once.
    """
    if dtype != torch.bfloat16 or device_type != "mps" or _has_kernel(Path(path), probe_kernel):
        return None
    return "this Mac's Metal has no bfloat (needs Metal 3.1: macOS 14 or later)"


@functools.lru_cache(maxsize=None)
def _has_kernel(path: Path, name: str) -> bool:
    try:
        kernel(path, name, "mps")
    except RuntimeError:
        return False
    return True


def max_threads_per_threadgroup(fn: Any, default: int = 1024) -> int:
    """The most threads a threadgroup of kernel ``fn`` may have (its pipeline's limit)."""
    value = getattr(fn, "max_threads_per_threadgroup", None)
    if callable(value):
        value = value()
    return int(value) if value else default
