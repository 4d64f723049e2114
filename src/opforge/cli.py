"""The ``opforge`` command: ``info``, ``verify``, ``bench``, ``generate``, ``serve``, ``bench-serve``."""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from .runtime import registry


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``opforge`` command line; returns the exit status.

    Example:
        >>> from opforge.cli import main
        >>> main(["info"])   # doctest: +SKIP
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "generate":
        from .serve.generate_cli import main as generate_main
        return generate_main(argv[1:])
    if argv and argv[0] == "serve":
        from .serve.cli import main as serve_main
        return serve_main(argv[1:])
    if argv and argv[0] == "bench-serve":
        from .serve.bench_cli import main as bench_serve_main
        return bench_serve_main(argv[1:])
    if argv and argv[0] == "bench":
        from .bench.cli import main as bench_main
        return bench_main(argv[1:])
    parser = argparse.ArgumentParser(prog="opforge", description="Verified, fast GPU kernels for transformer inference.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="describe the devices and backends on this machine")
    verify = sub.add_parser(
        "verify", help="check every op on every available backend against float64",
        description="Run every op on every backend this machine has (Triton on a GPU or in its interpreter, "
                    "Metal on an Apple GPU or in the MSL emulator, the torch path) over a grid of shapes and "
                    "dtypes, compare each result with the float64 torch reference, and print one row per case. "
                    "Exit status 1 if any case fails.",
        epilog=f"op names for --ops: {', '.join(registry.ops())}")
    verify.add_argument("--ops", metavar="OP[,OP...]",
                        help="comma-separated op names, listed below (default: all)")
    verify.add_argument("--quick", action="store_true", help="fewer shapes and dtypes per op (default: all)")
    sub.add_parser("bench", help="benchmark opforge against its peers (see `opforge bench --help`)")
    sub.add_parser("generate", help="generate text with a Llama-family checkpoint (see `opforge generate --help`)")
    sub.add_parser("serve", help="serve a checkpoint over the OpenAI API (see `opforge serve --help`)")
    sub.add_parser("bench-serve", help="load-test an OpenAI-compatible server (see `opforge bench-serve --help`)")
    args = parser.parse_args(argv)
    if args.command == "info":
        from .verify import print_info
        return print_info()
    from .verify import run_verify
    return run_verify(ops=args.ops.split(",") if args.ops else None, quick=args.quick)
