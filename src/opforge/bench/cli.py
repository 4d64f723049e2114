"""``opforge bench``: measure opforge against its peers and write the evidence.

Exit codes: 0 done; 1 done, but an opforge result was wrong or raised; 2 bad
arguments (unknown suite, op, implementation or dtype, a device that is not there,
an unusable output path).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from opforge.bench.results import ERROR, WRONG, RunResult
from opforge.bench.catalog import get_suite, op_names, suite_names
from opforge.bench.fmt import split_list
from opforge.bench.spec import DTYPES, IMPL_ORDER, OPFORGE, parse_shape

EPILOG = """\
examples:
  opforge bench                                   # the users' table (suite seed) on the best device
  opforge bench --suite llm --ops rms_norm --json rms.json
  opforge bench --suite seed,llm,latency --json r.json --markdown r.md --plot bw.png
  opforge bench --device cpu --shapes 2x32x256 --quick
  opforge bench --from-json r.json --compact      # re-render a saved run, no measuring
  opforge bench --suite serve --quick             # the serving engine on small workloads
  opforge bench --suite io --device cuda --json io.json   # loading a checkpoint onto the GPU
"""


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for docs and tests)."""
    p = _Parser(prog="opforge bench", description=__doc__.splitlines()[0], epilog=EPILOG,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", action="append", metavar="NAMES",
                   help="suites to run, comma-separated, or 'all' (default: seed)")
    p.add_argument("--ops", action="append", metavar="NAMES", help="only these ops (comma-separated)")
    p.add_argument("--impls", action="append", metavar="NAMES",
                   help=f"only these implementations; known: {', '.join(IMPL_ORDER)}")
    p.add_argument("--device", default=None, help="cuda, cuda:N, mps or cpu (default: the best available)")
    p.add_argument("--dtypes", action="append", metavar="NAMES",
                   help=f"replace the suites' dtypes ({', '.join(DTYPES)})")
    p.add_argument("--shapes", action="append", metavar="SHAPES",
                   help="replace the suites' shapes, e.g. 2x32x256,4096x1024")
    p.add_argument("--json", metavar="PATH", help="write every number and the environment as JSON")
    p.add_argument("--markdown", metavar="PATH", help="write the tables as Markdown")
    p.add_argument("--plot", metavar="PATH.png",
                   help="write plots (one file per suite, PATH-<suite>.png, when several)")
    reps = p.add_mutually_exclusive_group()
    reps.add_argument("--reps", type=int, metavar="N", help="exactly N timed calls per measurement")
    reps.add_argument("--quick", action="store_true", help="few reps: a smoke test, not for publishing")
    p.add_argument("--max-seconds", "--budget", type=float, metavar="S",
                   help="stop starting new measurements after S seconds (the rest is reported as skipped)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the inputs (default 0)")
    p.add_argument("--progress", choices=("auto", "rich", "lines", "none"), default="auto",
                   help="progress display (default: a bar on a terminal, lines otherwise)")
    view = p.add_mutually_exclusive_group()
    view.add_argument("--compact", action="store_true", help="print a compact summary instead of full tables")
    view.add_argument("--no-table", action="store_true", help="print no table")
    p.add_argument("--from-json", metavar="PATH", help="render a saved run instead of measuring")
    p.add_argument("--list", action="store_true", help="list suites, ops and implementations, then exit")
    return p


def _list() -> None:
    out = sys.stdout
    print("suites:", file=out)
    for name in suite_names():
        s = get_suite(name)
        ops = ", ".join(dict.fromkeys(e.op for e in s.entries))
        print(f"  {name:8s} {s.description} [{ops}]", file=out)
    print("  model    a decoder end to end: decode b1/8/32 x ctx 512/4096, prefill 1x2048/8x512, bf16/int8/int4, "
          "transformers peers (--shapes 1b,8b, --budget S)", file=out)
    print("  serve    the serving engine offline: ragged-64/256, shared-prefix (with and without prefix caching), "
          "batch1; peers static generate, transformers generate_batch (--ops WORKLOADS, --impls, --quick)", file=out)
    print("  io       loading a SafeTensors checkpoint (~3 GB bf16, --shapes GB, --quick: small): GB/s and host "
          "memory of opforge.load_safetensors (plain, int4) vs safetensors' loaders", file=out)
    print("  torch_path_decode  CPU: SmolLM2-135M greedy decode, opforge generate vs transformers eager, float32",
          file=out)
    print("ops: " + ", ".join(op_names()), file=out)
    print("implementations: " + ", ".join(IMPL_ORDER), file=out)


def _check_out_path(path: str | None, what: str, suffixes: tuple[str, ...] | None = None) -> None:
    if path is None:
        return
    p = Path(path)
    if suffixes and p.suffix.lower() not in suffixes:
        raise _UsageError(f"{what} path {path!r} must end with one of {', '.join(suffixes)}")
    if p.exists() and p.is_dir():
        raise _UsageError(f"{what} path {path!r} is a directory")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _UsageError(f"cannot create the folder of {what} path {path!r}: {exc}") from None


def _options(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from opforge.bench.envinfo import pick_device
    from opforge.bench.runner import RunOptions, UsageError, plan
    from opforge.bench.timing import TimingConfig

    suites = list(dict.fromkeys(split_list(args.suite) or ["seed"]))
    if "all" in suites:
        suites = suite_names()
    dtypes = None
    if args.dtypes:
        unknown = [d for d in split_list(args.dtypes) or [] if d not in DTYPES]
        if unknown:
            raise _UsageError(f"unknown dtype(s) {', '.join(unknown)}; known: {', '.join(DTYPES)}")
        dtypes = [DTYPES[d] for d in split_list(args.dtypes) or []]
    shapes = None
    if args.shapes:
        try:
            shapes = [parse_shape(s) for s in split_list(args.shapes) or []]
        except ValueError as exc:
            raise _UsageError(str(exc)) from None
    if args.reps is not None and args.reps < 1:
        raise _UsageError("--reps must be at least 1")
    if args.max_seconds is not None and args.max_seconds <= 0:
        raise _UsageError("--max-seconds must be positive")
    try:
        device = pick_device(args.device)
    except ValueError as exc:
        raise _UsageError(str(exc)) from None
    timing = TimingConfig.quick() if args.quick else TimingConfig.fixed(args.reps) if args.reps else TimingConfig()
    opts = RunOptions(device=device, suites=suites, ops=split_list(args.ops), impls=split_list(args.impls),
                      dtypes=dtypes, shapes=shapes, timing=timing, max_seconds=args.max_seconds, seed=args.seed)
    try:
        plan(opts)
    except UsageError as exc:
        raise _UsageError(str(exc)) from None
    return opts


def _write_outputs(run: RunResult, args: argparse.Namespace, final: bool) -> list[str]:
    from opforge.bench import markdown

    written = []
    if args.json:
        run.save_json(args.json)
        written.append(args.json)
    if args.markdown:
        markdown.write(run, args.markdown)
        written.append(args.markdown)
    if args.plot and final:
        from opforge.bench import plot

        written += [str(p) for p in plot.write(run, args.plot)]
    return written


def _opforge_failed(run: RunResult) -> bool:
    return any(c.results.get(OPFORGE) is not None and c.results[OPFORGE].status in (WRONG, ERROR)
               for s in run.suites for c in s.cases)


def main(argv: list[str] | None = None) -> int:
    """Run ``opforge bench`` with ``argv`` (``sys.argv[1:]`` if None); returns the exit code.

    Example:
        >>> main(["--device", "cpu", "--shapes", "2x64", "--quick", "--impls", "torch"])  # doctest: +SKIP
        0
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.list:
            _list()
            return 0
        if "model" in (split_list(args.suite) or []):      # an end-to-end run, not an op table
            if split_list(args.suite) != ["model"]:
                raise _UsageError("run --suite model on its own")
            from opforge.bench.suites.model import main as model_main
            return model_main(args)
        if "serve" in (split_list(args.suite) or []):      # the serving engine on workloads, not an op table
            if split_list(args.suite) != ["serve"]:
                raise _UsageError("run --suite serve on its own")
            from opforge.bench.suites.serve import main as serve_main
            return serve_main(args)
        if "io" in (split_list(args.suite) or []):         # loading a checkpoint, not an op table
            if split_list(args.suite) != ["io"]:
                raise _UsageError("run --suite io on its own")
            from opforge.bench.suites.io import main as io_main
            return io_main(args)
        if "torch_path_decode" in (split_list(args.suite) or []):  # the CPU decode, end to end
            if split_list(args.suite) != ["torch_path_decode"]:
                raise _UsageError("run --suite torch_path_decode on its own")
            from opforge.bench.suites.cpu_decode import main as decode_main
            return decode_main(args)
        _check_out_path(args.json, "--json")
        _check_out_path(args.markdown, "--markdown")
        _check_out_path(args.plot, "--plot", (".png", ".svg", ".pdf"))
        if args.plot:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise _UsageError("--plot needs matplotlib (pip install 'opforge[bench]')") from None
        if args.from_json:
            try:
                run = RunResult.load_json(args.from_json)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise _UsageError(f"cannot read --from-json {args.from_json!r}: {exc}") from None
        else:
            opts = _options(args)
    except _UsageError as exc:
        print(f"opforge bench: error: {exc}", file=sys.stderr)
        print("try 'opforge bench --help'", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return int(exc.code or 0)

    from opforge.bench.report import Printer, print_compact, print_full

    if not args.from_json:
        from opforge.bench.progress import make_progress
        from opforge.bench.runner import Runner

        runner = Runner(opts, make_progress(args.progress), on_suite_done=lambda r: _write_outputs(r, args, False))
        run = runner.run()
    written = _write_outputs(run, args, True)
    printer = Printer()
    if args.compact:
        print_compact(run, printer)
    elif not args.no_table:
        print_full(run, printer)
    for path in written:
        printer.line(f"wrote {path}")
    return 1 if _opforge_failed(run) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
