"""Compiled forms of one traced graph, and the per-shape plans that launch them.

A *kernel* is generated source imported as a module, for one (graph, backend, layout
structure). A *plan* binds a kernel to one call signature (exact shapes, strides, devices):
grid, block sizes, size arguments and output dtypes are computed once, so a cached call only
allocates the outputs and launches.

Example:
    >>> import torch
    >>> from opforge.fusion.tracer import trace
    >>> from opforge.fusion.layout import analyze
    >>> args = (torch.ones(2, 3), 1.5)
    >>> r = trace(lambda x, s: x * s, args)
    >>> nodes = r.graph.reachable()
    >>> kernel = TorchKernel(r.graph, nodes, "f")
    >>> plan = kernel.plan(analyze(r.graph, nodes, args, "f"), args, single=True)
    >>> plan.run(args)
    tensor([[1.5000, 1.5000, 1.5000],
            [1.5000, 1.5000, 1.5000]])
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from . import cache, codegen_msl, codegen_torch, config
from .graph import Graph, Node
from .outputs import empty, safe_name
from .layout import HOST, STRIDED, Layout, ceil_div


def _number_spec(v: Any) -> Any:
    """What Triton's generic launch key records for a Python number (see runtime.triton.launch)."""
    if type(v) is int:
        return (v == 1, v & 15 == 0, -2**31 <= v < 2**31)
    return v if type(v) is bool else type(v)


class Plan:
    """A kernel bound to one call signature. ``run(args)`` returns the outputs."""

    backend = "torch"
    variant = "composite"
    trace_position = 0
    note = ""
    fallback_reason: Optional[str] = None    # set when the torch path stands in for a kernel
    source = "# no kernel: the outputs are empty"

    def run(self, args: Sequence[Any]) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError


class EmptyPlan(Plan):
    """Zero-element outputs: nothing to launch."""

    def __init__(self, backend: str, shape: torch.Size, dtypes: list, device: torch.device, single: bool):
        self.backend, self.variant = backend, "empty"
        self.shape, self.dtypes, self.device, self.single = shape, dtypes, device, single

    def run(self, args: Sequence[Any]) -> Any:
        outs = [empty(self.shape, d, self.device) for d in self.dtypes]
        return outs[0] if self.single else tuple(outs)


class SplitPlan(Plan):
    """Outputs of different shapes: one plan (kernel) per shape, results put back in order."""

    def __init__(self, parts: list, groups: list[list[int]], n_outputs: int):
        self.parts = list(zip(parts, groups))
        self.n_outputs = n_outputs
        self.backend = parts[0].backend
        self.variant = "+".join(p.variant for p in parts)
        self.trace_position = parts[0].trace_position
        self.note = f"{len(parts)} kernels (outputs of {len(parts)} shapes); " + "; ".join(p.note for p in parts)
        self.source = "\n\n".join(p.source for p in parts)

    def run(self, args: Sequence[Any]) -> Any:
        outs: list[Any] = [None] * self.n_outputs
        for plan, indices in self.parts:
            for i, out in zip(indices, plan.run(args)):
                outs[i] = out
        return tuple(outs)


class TorchKernel:
    """The graph as a generated Python function of torch ops."""

    backend = "torch"

    def __init__(self, graph: Graph, nodes: list[Node], name: str, title: str = ""):
        fname = f"{safe_name(name)}_torch"
        self.source = codegen_torch.generate(graph, nodes, fname, title)
        self.module = cache.load_module(self.source, fname)
        self.fn: Callable[..., tuple] = getattr(self.module, fname)
        self.positions = tuple([n.attr for n in nodes if n.op == "input"] + [n.attr for n in nodes if n.op == "scalar"])
        self.path = self.module.__file__

    def plan(self, layout: Layout, args: Sequence[Any], single: bool) -> Plan:
        return _TorchPlan(self, layout, single)


class _TorchPlan(Plan):
    def __init__(self, kernel: TorchKernel, layout: Layout, single: bool):
        self.fn, self.positions, self.single = kernel.fn, kernel.positions, single
        self.trace_position = _largest_input(layout)
        self.note = f"generated {kernel.fn.__name__}"

    def run(self, args: Sequence[Any]) -> Any:
        outs = self.fn(*[args[p] for p in self.positions])
        return outs[0] if self.single else outs


def _largest_input(layout: Layout) -> int:
    full = [p for p, c in layout.classes if c == "full"]
    return full[0] if full else layout.classes[0][0]


class TritonKernel:
    """The graph as a generated ``@triton.jit`` kernel, launched through ``TritonLauncher``."""

    backend = "triton"

    def __init__(self, graph: Graph, nodes: list[Node], layout: Layout, name: str, title: str = ""):
        from ..runtime.triton.launch import TritonLauncher
        from . import codegen_triton

        kname = f"{safe_name(name)}_kernel"
        self.source = codegen_triton.generate(graph, nodes, layout, kname, title)
        self.module = cache.load_module(self.source, kname)
        self.launcher = TritonLauncher(getattr(self.module, kname))
        self.signature = codegen_triton.signature(graph, nodes, layout)
        self.name = kname
        self.flat = layout.flat
        self.n_outputs = len(graph.outputs)
        self.scalar_positions = tuple(n.attr for n in nodes if n.op == "scalar")
        self.out_dtypes = [n.dtype for n in graph.outputs]
        self.path = self.module.__file__

    def plan(self, layout: Layout, args: Sequence[Any], single: bool) -> Plan:
        return _TritonPlan(self, layout, args, single)


class _TritonPlan(Plan):
    backend = "triton"

    def __init__(self, kernel: TritonKernel, layout: Layout, args: Sequence[Any], single: bool):
        self.launcher = kernel.launcher
        self.single = single
        self.shape = layout.shape
        self.dtypes = kernel.out_dtypes
        self.device = next(args[p].device for p, c in layout.classes if c != HOST)
        self.positions = tuple(p for p, _ in layout.classes) + kernel.scalar_positions
        self.hosts = tuple(i for i, (p, c) in enumerate(layout.classes) if c == HOST)
        self.tensor_ins = tuple(i for i, (p, c) in enumerate(layout.classes) if c != HOST)
        self.numbers = tuple(range(len(layout.classes), len(self.positions))) + self.hosts
        self.trace_position = _largest_input(layout)
        itemsize = max(args[p].element_size() for p, _ in layout.classes)
        if layout.flat:
            block, self.num_warps = config.flat_config(layout.numel, itemsize)
            self.grid = (ceil_div(layout.numel, block),)
            self.tail = (layout.numel, block)
            self.variant = "flat"
        else:
            block_m, block_n, self.num_warps = config.tiled_config(layout.rows, layout.cols, itemsize)
            tiles_n = ceil_div(layout.cols, block_n)
            self.grid = (ceil_div(layout.rows, block_m) * tiles_n,)
            tail: list[int] = [layout.rows, layout.cols, tiles_n]
            if any(c == STRIDED for _, c in layout.classes):
                tail += list(layout.shape[:-1])
                for _, strides in layout.strides:
                    tail += list(strides)
            self.tail = tuple(tail) + (block_m, block_n)
            self.variant = "tiled"
        self.note = f"{kernel.name} in {kernel.path}"
        from ..runtime.backends import triton_interpreting
        self.interpreted = triton_interpreting()

    def run(self, args: Sequence[Any]) -> Any:
        ins = [args[p] for p in self.positions]
        for i in self.hosts:
            ins[i] = ins[i].item()
        outs = [empty(self.shape, d, self.device) for d in self.dtypes]
        if self.interpreted:
            import numpy as np
            with np.errstate(all="ignore"):
                self.launcher(self.grid, (*outs, *ins, *self.tail), self.num_warps)
            return outs[0] if self.single else tuple(outs)
        self.launcher(self.grid, (*outs, *ins, *self.tail), self.num_warps, key=self.launch_key(ins))
        return outs[0] if self.single else tuple(outs)

    def launch_key(self, ins: Sequence[Any]) -> tuple:
        """What Triton specializes on beyond this plan: input alignment, and the Python numbers as
        the launcher's generic key sees them (outputs come from the caching allocator: aligned)."""
        key = (self, *[ins[i].data_ptr() & 15 == 0 for i in self.tensor_ins])
        if self.numbers:
            key += tuple(_number_spec(ins[i]) for i in self.numbers)
        return key


def build(backend: str, graph: Graph, nodes: list[Node], layout: Optional[Layout], name: str, title: str) -> Any:
    """Generate and import the kernel of ``backend`` for this graph (and layout, for Triton)."""
    if backend == "torch":
        return TorchKernel(graph, nodes, name, title)
    if backend == "triton":
        assert layout is not None
        return TritonKernel(graph, nodes, layout, name, title)
    if backend == "metal":
        return codegen_msl.build(graph, nodes, layout, name, title)
    raise ValueError(f"unknown backend {backend!r}")
