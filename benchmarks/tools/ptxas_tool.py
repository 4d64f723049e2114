"""Run triton's bundled ``ptxas -v`` on PTX text for sm_90a: the registers, spills and shared
memory report the ``*_ptx.py`` / ``*_registers.py`` scripts parse (no GPU needed).

    from ptxas_tool import ptxas_verbose      # benchmarks/ is on sys.path when a script there runs
"""
from __future__ import annotations

import os
import subprocess
import tempfile

import triton

PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def ptxas_verbose(ptx: str, arch: str = "sm_90a") -> str:
    """``ptxas -v``'s report (its stderr) for ``ptx``, assembled in a temporary folder."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        return subprocess.run([PTXAS, f"-arch={arch}", "-v", path, "-o", os.path.join(tmp, "k.cubin")],
                              capture_output=True, text=True).stderr
