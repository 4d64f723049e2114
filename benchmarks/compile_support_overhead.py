"""Host cost of opforge's eager wrapper (compile check + autograd check) per call, on CPU.

Times a no-op function with and without ``runtime.compile_support.compiled``, so the op's own work
does not drown the few hundred nanoseconds being measured. Usage:
    PYTHONPATH=src python benchmarks/compile_support_overhead.py
"""
import timeit

import torch

from opforge.runtime.compile_support import compiled


def _fake(x, w):
    return torch.empty_like(x)


def bare(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x


wrapped = compiled("overhead_probe", _fake)(bare)
no_check = compiled("overhead_probe_nograd", _fake, grad_check=False)(bare)


def best(fn, *args, number=200_000, repeat=9):
    return min(timeit.repeat(lambda: fn(*args), number=number, repeat=repeat)) / number * 1e9


def main():
    x, w = torch.randn(4), torch.randn(4)
    rows = [("is_compiling() alone", best(torch.compiler.is_compiling)),
            ("is_grad_enabled() alone", best(torch.is_grad_enabled)),
            ("bare function", best(bare, x, w)),
            ("wrapped, compile check only", best(no_check, x, w)),
            ("wrapped, grad mode on (both checks)", best(wrapped, x, w))]
    with torch.no_grad():
        rows.append(("wrapped, under no_grad", best(wrapped, x, w)))
    for name, ns in rows:
        print(f"{name:40s} {ns:7.0f} ns")
    base = rows[2][1]
    print(f"wrapper cost: {rows[3][1] - base:.0f} ns (compile check), {rows[4][1] - base:.0f} ns (both checks), "
          f"{rows[5][1] - base:.0f} ns (no_grad)")


if __name__ == "__main__":
    main()
