"""Per-call facts: shapes through the graph (torch's broadcasting errors included), the iteration
space, and how each tensor input is addressed from it.

A kernel walks the output, of shape S, as M rows of N = S[-1] elements. Each tensor input is
read in one of these ways (its *class*, part of the kernel's cache key):

* ``full``: S itself, packed: element ``i`` of the output reads element ``i``.
* ``scalar``: one element, read once.
* ``host``: a zero-dimensional CPU tensor beside device tensors: its value is passed like a number.
* ``row``: a packed (N,) vector broadcast over the rows: column ``j`` reads element ``j``.
* ``col``: a packed (..., 1) tensor broadcast over the columns: row ``r`` reads element ``r``.
* ``strided``: anything else (views, transposes, expands): offsets from per-dimension strides.

Only ``full``/``scalar``/``host`` inputs give a *flat* kernel (one block of a flattened range
per program); any other gives a *tiled* kernel (BLOCK_M x BLOCK_N tiles of the (M, N) view).

Example:
    >>> import torch
    >>> input_class(torch.ones(8), torch.Size([4, 8]), torch.device("cpu"))
    'row'
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from .errors import FusionError
from .graph import Graph, Node

FULL, SCALAR, HOST, ROW, COL, STRIDED = "full", "scalar", "host", "row", "col", "strided"
FLAT_CLASSES = (FULL, SCALAR, HOST)
I32_LIMIT = 2**31 - 2**20   # offsets at or past this (a block of slack included) need int64


def _broadcast_pair(a: tuple, b: tuple) -> Optional[tuple]:
    if a == b:
        return a
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + a
    b = (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return tuple(out)


def _torch_error(a: tuple, b: tuple, node: Node) -> RuntimeError:
    """The error torch raises for these shapes, with the user's line added."""
    try:  # zero-stride views: torch checks the shapes without any memory behind them
        torch.zeros(()).expand(a) + torch.zeros(()).expand(b)
        message = f"shapes {a} and {b} cannot be broadcast together"
    except RuntimeError as exc:
        message = str(exc)
    if node.line is not None:
        message += f" (at {node.line})"
    return RuntimeError(message)


def node_shapes(graph: Graph, nodes: Sequence[Node], args: Sequence[Any]) -> dict[int, tuple]:
    """The shape of every tensor node (Python-number nodes have none), raising as torch would."""
    shapes: dict[int, tuple] = {}
    for node in nodes:
        if node.op == "input":
            shapes[node.index] = tuple(args[node.attr].shape)
            continue
        if not node.is_tensor:
            continue
        shape: Optional[tuple] = None
        for arg in node.inputs:
            arg_shape = shapes.get(arg.index)
            if arg_shape is None:
                continue
            if shape is None:
                shape = arg_shape
                continue
            merged = _broadcast_pair(shape, arg_shape)
            if merged is None:
                raise _torch_error(shape, arg_shape, node)
            shape = merged
        shapes[node.index] = shape if shape is not None else ()
    return shapes


def _contiguous_strides(shape: Sequence[int]) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return strides[::-1]


def effective_strides(t: torch.Tensor, shape: torch.Size) -> list[int]:
    """Strides of ``t`` broadcast to ``shape``: 0 along broadcast dimensions."""
    rank = len(shape)
    pad = rank - t.dim()
    strides = [0] * rank
    for d in range(t.dim()):
        if t.shape[d] != 1:
            strides[pad + d] = t.stride(d)
    return strides


def input_class(t: torch.Tensor, shape: torch.Size, device: torch.device) -> str:
    """How a kernel iterating over ``shape`` on ``device`` reads ``t`` (see the module doc)."""
    if t.device != device:
        return HOST
    rank = len(shape)
    strides = effective_strides(t, shape)
    expected = _contiguous_strides(shape)
    sized = [d for d in range(rank) if shape[d] != 1]
    if all(strides[d] == expected[d] for d in sized):
        return FULL
    if t.numel() == 1:
        return SCALAR
    last = rank - 1
    if strides[last] == 1 and all(strides[d] == 0 for d in sized if d != last):
        return ROW
    if strides[last] == 0 and shape[last] != 1:
        lead = _contiguous_strides(shape[:last])
        if all(strides[d] == lead[d] for d in sized if d != last):
            return COL
    return STRIDED


@dataclass(frozen=True)
class Layout:
    """The iteration space of one call and how each used tensor input is read.

    ``classes`` pairs each used tensor argument position with its class; ``strides`` holds,
    for strided inputs, their effective strides over S.
    """

    shape: torch.Size
    numel: int
    rows: int
    cols: int
    classes: tuple[tuple[int, str], ...]
    strides: tuple[tuple[int, tuple[int, ...]], ...]
    i64: bool

    @property
    def flat(self) -> bool:
        return all(c in FLAT_CLASSES for _, c in self.classes)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def structure(self) -> tuple:
        """What the generated source depends on (not the sizes): part of the kernel cache key."""
        return (self.classes, self.rank if any(c == STRIDED for _, c in self.classes) else None, self.i64)


def output_groups(graph: Graph, shapes: dict[int, tuple]) -> list[list[int]]:
    """Output indices grouped by shape, in order of first appearance (one kernel per group)."""
    groups: dict[tuple, list[int]] = {}
    for i, node in enumerate(graph.outputs):
        groups.setdefault(shapes[node.index], []).append(i)
    return list(groups.values())


def analyze(graph: Graph, nodes: Sequence[Node], args: Sequence[Any], name: str,
            shapes: Optional[dict[int, tuple]] = None) -> Layout:
    """Check shapes and devices of one call and describe its iteration space.

    The outputs of ``graph`` must share one shape (``output_groups`` splits those that do not).
    """
    if shapes is None:
        shapes = node_shapes(graph, nodes, args)
    out_shapes = [shapes[n.index] for n in graph.outputs]
    if any(s != out_shapes[0] for s in out_shapes):
        listed = ", ".join(f"output {i}: {tuple(s)}" for i, s in enumerate(out_shapes))
        raise FusionError(f"{name}: one kernel needs outputs of one shape ({listed})")
    shape = torch.Size(out_shapes[0])
    positions = sorted(n.attr for n in nodes if n.op == "input")
    device = call_device(args, positions, name)
    numel = shape.numel()
    cols = shape[-1] if len(shape) else 1
    rows = numel // cols if cols else 0
    classes, strides = [], []
    reach = numel
    for p in positions:
        t = args[p]
        cls = input_class(t, shape, device)
        classes.append((p, cls))
        if cls == STRIDED:
            eff = effective_strides(t, shape)
            strides.append((p, tuple(eff)))
            reach = max(reach, sum((size - 1) * st for size, st in zip(shape, eff)) + 1)
    return Layout(shape, numel, rows, cols, tuple(classes), tuple(strides), reach >= I32_LIMIT)


def call_device(args: Sequence[Any], positions: Sequence[int], name: str) -> torch.device:
    """The device of the call: that of the tensors with dimensions; 0-d CPU tensors may ride along."""
    devices = {args[p].device for p in positions if args[p].dim() > 0 or args[p].device.type != "cpu"}
    if not devices:
        devices = {args[p].device for p in positions}
    if len(devices) > 1:
        a, b = sorted(map(str, devices))[:2]
        raise RuntimeError(f"{name}: expected all tensors to be on the same device, but found at least two "
                           f"devices, {a} and {b}!")
    return next(iter(devices))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << math.ceil(math.log2(n))
