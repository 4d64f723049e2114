"""Output allocation, with an optional poison fill so tests catch elements a kernel never writes,
and what happens when memory runs out.

    with opforge.runtime.alloc.poisoned_outputs():
        y = opforge.layer_norm(x)     # y started as all-NaN; any unwritten element stays NaN

Out of memory inside an opforge call (any allocation of its outputs or scratch): ``dispatch.run``
frees what opforge caches (every ``runtime.lru`` cache and the launch plans), calls
``torch.cuda.empty_cache()``, and runs the call once more; if that fails too it raises
``OutOfMemoryError``, a subclass of ``torch.OutOfMemoryError`` naming the op, the shapes and the
bytes asked for. Inputs are never written before outputs are allocated, so nothing is left
half-written. ``simulate_out_of_memory(n)`` makes the next n allocations made here fail, for tests.
"""
from __future__ import annotations

import contextlib
import re
import threading
from typing import Any, Callable, Iterator, Optional, Sequence

import torch

_poison = False
_fail_next = 0  # allocations left to fail under simulate_out_of_memory()
_request = threading.local()  # the bytes of the allocation that last failed in this thread


class OutOfMemoryError(torch.OutOfMemoryError):
    """An opforge call ran out of memory even after opforge freed its caches and retried once.

    A subclass of ``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError``), so existing
    handlers catch it. Attributes: ``op``, ``inputs`` (what the call was given, as text) and
    ``nbytes`` (the allocation that failed, or None if torch did not say).
    """

    def __init__(self, op: str, inputs: str, nbytes: Optional[int], cause: BaseException):
        self.op, self.inputs, self.nbytes = op, inputs, nbytes
        asked = f"{nbytes} bytes ({nbytes / 2**20:.1f} MiB)" if nbytes is not None else "an unknown size"
        first_line = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        super().__init__(f"opforge.{op} ran out of memory allocating {asked} for {inputs}, after freeing "
                         f"opforge's caches and torch's cached blocks and retrying once. torch said: {first_line}")


def _allocation_failed(nbytes: int, error: BaseException) -> None:
    _request.nbytes = nbytes
    raise error


def _maybe_fail(nbytes: int) -> None:
    global _fail_next
    if _fail_next > 0:
        _fail_next -= 1
        _allocation_failed(nbytes, torch.OutOfMemoryError(
            f"simulated out of memory (opforge.runtime.alloc.simulate_out_of_memory). Tried to allocate {nbytes} bytes"))


def _nbytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n * dtype.itemsize


def _fill_poison(out: torch.Tensor) -> None:
    out.fill_(float("nan") if out.dtype.is_floating_point else torch.iinfo(out.dtype).min)  # ints: their minimum


def empty(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.empty``, NaN-filled while ``poisoned_outputs()`` is active."""
    if _fail_next:
        _maybe_fail(_nbytes(shape, dtype))
    try:
        out = torch.empty(shape, dtype=dtype, device=device)
    except torch.OutOfMemoryError as error:
        _allocation_failed(_nbytes(shape, dtype), error)
    if _poison:
        _fill_poison(out)
    return out


def empty_packed_like(x: torch.Tensor) -> torch.Tensor:
    """A packed tensor of x's shape, dtype and device (``empty_like`` is the cheapest call for that)."""
    if _fail_next:
        _maybe_fail(_nbytes(x.shape, x.dtype))
    try:
        out = torch.empty_like(x) if x.is_contiguous() else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    except torch.OutOfMemoryError as error:
        _allocation_failed(_nbytes(x.shape, x.dtype), error)
    if _poison:
        _fill_poison(out)
    return out


_counter_buffers: dict = {}


def tile_counters(device: torch.device, tiles: int) -> torch.Tensor:
    """Zeroed int32 arrival counters for kernels whose last program of a tile finishes the tile
    (a K-split or KV-split reduction inside the kernel): zeroed once, and left at zero by every
    launch (that last program resets its counter). One buffer per device and CUDA stream
    (launches on one stream run in order), so two streams never share counters.

    Example:
        >>> tile_counters(torch.device("cpu"), 8).abs().sum().item()
        0
    """
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else None
    key = (device, stream)
    buf = _counter_buffers.get(key)
    if buf is None or buf.numel() < tiles:
        buf = _counter_buffers[key] = torch.zeros(max(tiles, 4096), dtype=torch.int32, device=device)
    return buf


@contextlib.contextmanager
def simulate_out_of_memory(times: int = 1) -> Iterator[None]:
    """Make the next ``times`` allocations through this module raise ``torch.OutOfMemoryError``
    (fault injection for tests; any thread's allocation counts).

    Example:
        >>> with simulate_out_of_memory(1):
        ...     try:
        ...         empty((2, 3), torch.float32, torch.device("cpu"))
        ...     except torch.OutOfMemoryError as error:
        ...         print(str(error).split(".")[0])
        simulated out of memory (opforge
        >>> empty((2, 3), torch.float32, torch.device("cpu")).shape   # the next one succeeds
        torch.Size([2, 3])
    """
    global _fail_next
    previous, _fail_next = _fail_next, times
    try:
        yield
    finally:
        _fail_next = previous


_TRIED = re.compile(r"Tried to allocate ([0-9.]+) ?([KMGT]i?B|bytes|B)")
_UNITS = {"B": 1, "bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
          "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


def _requested_bytes(error: BaseException) -> Optional[int]:
    """The failed allocation's size: recorded by ``empty``, else read from torch's message."""
    nbytes = getattr(_request, "nbytes", None)
    _request.nbytes = None
    if nbytes is not None:
        return nbytes
    match = _TRIED.search(str(error))
    return int(float(match.group(1)) * _UNITS[match.group(2)]) if match else None


def free_caches() -> None:
    """Drop everything opforge caches (compiled-kernel handles, plans, selections, problems) and
    torch's cached, unused GPU blocks. Every one of them is a ``runtime.lru.LRU`` (the launch
    plans' caches too), so one ``lru.clear_all()`` empties them."""
    from . import lru
    lru.clear_all()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def retry_after_out_of_memory(op: str, describe: Callable[[], str], error: BaseException,
                              again: Callable[[], Any]) -> Any:
    """What ``dispatch.run`` does when a call ran out of memory: free caches, retry once, else
    raise ``OutOfMemoryError`` naming the op, ``describe()`` and the bytes asked for. During CUDA
    graph capture it raises at once (emptying torch's cache is not allowed there)."""
    if _capturing():  # freeing torch's cached blocks is illegal mid-capture: no retry
        nbytes, second_error = _requested_bytes(error), error
    else:
        _request.nbytes = None
        del error  # let the failed attempt's frames (and any tensors they hold) go before retrying
        free_caches()
        try:
            return again()
        except torch.OutOfMemoryError as second:
            nbytes = _requested_bytes(second)
            second_error = second
    try:
        inputs = describe()
    except Exception:  # pragma: no cover - a description must never hide the real error
        inputs = "its inputs"
    raise OutOfMemoryError(op, inputs, nbytes, second_error) from second_error


@contextlib.contextmanager
def poisoned_outputs(enabled: bool = True) -> Iterator[None]:
    """Fill every opforge output with NaN before the kernel runs (a testing aid; costs a write)."""
    global _poison
    previous, _poison = _poison, enabled
    try:
        yield
    finally:
        _poison = previous
