"""Do two source trees compile the norm kernels to the same PTX instructions? No GPU needed.

A change meant to leave the default kernels alone (a new constexpr path that is off by default,
say) can be checked without a GPU: compile both trees' kernels for sm_90 as a launch of packed
rows specializes them (``norm_registers.compile_ptx``) and compare the PTX, ignoring debug
information (file paths, line tables).

    git worktree add /tmp/before <commit>
    python benchmarks/tools/ptx_unchanged.py /tmp/before . [--extra PAIRED=True]

``--extra NAME=VALUE`` passes a constexpr only the second tree's kernels take (its default).
Exit code 0 when every compiled variant has the same instructions, 1 otherwise.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

CHILD = r'''
import json, os, sys
sys.path.insert(0, sys.argv[1] + "/src")              # that tree's opforge
sys.path.insert(0, sys.argv[3])                       # this tree's benchmarks/, for compile_ptx
from norm_registers import compile_ptx, tk
extra = json.loads(sys.argv[2])
out = {}
for name, consts in [("_tile_kernel", dict(BLOCK_M=1, BLOCK_N=4096)), ("_tile_kernel", dict(BLOCK_M=16, BLOCK_N=128)),
                     ("_looped_kernel", dict(CHUNK=32768))]:
    for dt in ("bf16", "fp16", "fp32"):
        for rms in (False, True):
            for res in (False, True):
                c = dict(IS_RMS=rms, HAS_RES=res, HAS_W=True, HAS_B=not rms, **consts, **extra)
                out[f"{name} {consts} {dt} rms={rms} residual={res}"] = compile_ptx(getattr(tk, name), c, dt, 8)
json.dump(out, sys.stdout)
'''


def instructions(ptx: str) -> list[str]:
    """PTX lines that are code: no comments, no debug sections, no .loc/.file directives, no
    ``$L__tmp`` labels (debug markers of inlined calls, renumbered when a helper is factored out)."""
    body = ptx.split("\t.section\t.debug", 1)[0]
    lines = []
    for line in body.splitlines():
        line = re.sub(r"//.*", "", line).strip()
        if line and not line.startswith((".loc", ".file", ".b8", ".b32", "$L__tmp")):
            lines.append(line)
    return lines


def compile_tree(tree: str, extra: dict) -> dict:
    import json
    here = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, "-c", CHILD, tree, json.dumps(extra), here], check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--extra", action="append", default=[], help="NAME=INT constexpr for the second tree")
    args = ap.parse_args()
    extra = {k: int(v) for k, v in (e.split("=", 1) for e in args.extra)}
    before, after = compile_tree(args.before, {}), compile_tree(args.after, extra)
    differing = [k for k in before if instructions(before[k]) != instructions(after.get(k, ""))]
    for key in before:
        print(f"{'DIFFERENT' if key in differing else 'same     '}  {key}")
    print(f"{len(before) - len(differing)}/{len(before)} variants compile to the same instructions")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
