"""Programmatic dependent launch (PDL) for Triton kernels on Hopper and newer NVIDIA GPUs.

A decode step is a chain of ~180 small dependent kernels. Normally a kernel's blocks are
scheduled only once the kernel before it has finished; with PDL the next kernel is launched while
its predecessor still runs, and its blocks wait on the device (``griddepcontrol.wait``) for the
predecessor's completion and memory. The launch and scheduling latency overlaps the
predecessor's tail. Measured on the H100 (at fed7445, a probe kept in benchmarks/NOTES.md, a CUDA graph
of 48 norm -> GEMV pairs over 2048x2048 bf16 weights): 6.65 -> 5.22 us per pair.

A kernel opts in with a constexpr parameter named ``PDL`` and calls ``wait_for_previous(PDL)``
before its first global memory access (load or store: the wait also orders writes after the
predecessor's reads, which matters when the allocator reuses a buffer). ``TritonLauncher`` sees a
``PDL`` argument that is True and compiles and launches the kernel with ``launch_pdl=True``; the
kernel's callers pass ``on(device)``. The wait comes first, so a kernel is exactly as ordered as
without PDL; only the launch moves earlier. The one thing a kernel may do before it is
``prefetch_to_l2`` on data the previous kernel cannot write (weights): a hint that moves the first
DRAM reads of the planes kernel on large weights into the previous kernel's tail (8B int4 decode at
batch 1 +3.5%, ``benchmarks/results/h100/2026-11-28-31c2149``).

``OPFORGE_PDL=0`` in the environment (read once, at import) turns it off. It is also off under
Triton's interpreter, on GPUs before sm_90, on ROCm, and where Triton lacks ``gdc_wait``.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..switches import triton_interpreting
from .arch import nvidia_sm90_or_newer

#: Whether kernels that support PDL use it (``OPFORGE_PDL=0`` turns it off; read at import, fixed
#: for the process: launch keys and launch plans assume it does not change).
ENABLED = os.environ.get("OPFORGE_PDL", "1") not in ("", "0")

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    HAVE_GDC = True
except ImportError:   # an older Triton: no PDL
    HAVE_GDC = False

if HAVE_GDC:
    @triton.jit
    def wait_for_previous(PDL: tl.constexpr):
        """With PDL: wait for the previous kernel (completion and memory), then let the next
        kernel launch. Call before the kernel's first global load or store."""
        if PDL:
            gdc_wait()
            gdc_launch_dependents()

    @triton.jit
    def prefetch_to_l2(ptrs, mask, PDL: tl.constexpr):
        """With PDL: ask L2 for the 128-byte lines that hold ``ptrs`` (where ``mask``), a hint with
        no result. Before ``wait_for_previous`` it overlaps a kernel's first DRAM reads with the
        previous kernel's tail, for data that kernel cannot have changed (a layer's weights): L2
        is where global memory is coherent, so a line fetched early is still updated by any write
        in flight, and the loads after the wait read it as written."""
        if PDL:
            tl.inline_asm_elementwise(
                "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
                "=r,l,r", [ptrs.to(tl.int64, bitcast=False), mask.to(tl.int32)], dtype=tl.int32, is_pure=False,
                pack=1)
else:
    @triton.jit
    def wait_for_previous(PDL: tl.constexpr):
        """Without ``gdc_wait`` in this Triton: nothing (``on`` is always False)."""
        pass

    @triton.jit
    def prefetch_to_l2(ptrs, mask, PDL: tl.constexpr):
        """Without ``gdc_wait`` in this Triton: nothing (``on`` is always False)."""
        pass


def on(device: torch.device) -> bool:
    """Whether kernels on ``device`` launch with PDL (the ``PDL`` argument callers pass).

    Example:
        >>> import torch
        >>> on(torch.device("cpu"))
        False
    """
    return ENABLED and HAVE_GDC and device.type == "cuda" and not triton_interpreting() \
        and nvidia_sm90_or_newer(device.index if device.index is not None else torch.cuda.current_device())
