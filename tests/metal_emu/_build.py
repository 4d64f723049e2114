"""Build an MSL source into a shared library with g++, cached by content hash.

The cache key covers the rewritten C++ (which includes the whole preprocessed
kernel source), the shim headers, the compiler flags and the compiler's
version, so any change to any of them rebuilds.  Builds go to a temporary
name first and are renamed into place, so concurrent test processes never
load a half-written library.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ._source import Kernel, strip_metal_includes, translate

__all__ = ["BuildResult", "build", "cache_dir", "compiler", "plan"]

HERE = Path(__file__).resolve().parent
SHIM_FILES = ("metal_shim.h", "emu_exec.h")
CXXFLAGS = (
    "-std=c++20",
    "-O1",
    "-fPIC",
    "-shared",
    "-pthread",
    "-fvisibility=hidden",
    "-ffp-contract=off",
    "-fno-strict-aliasing",
    "-w",
)
_version_cache: dict[str, str] = {}


def compiler() -> str | None:
    """The C++ compiler to use: $CXX, else g++ on PATH, else None."""
    cxx = os.environ.get("OPFORGE_METAL_EMU_CXX") or os.environ.get("CXX") or "g++"
    return shutil.which(cxx)


def cache_dir() -> Path:
    """Where built libraries live ($OPFORGE_METAL_EMU_CACHE or ~/.cache)."""
    env = os.environ.get("OPFORGE_METAL_EMU_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "opforge" / "metal_emu"


def _compiler_version(cxx: str) -> str:
    if cxx not in _version_cache:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False)
        _version_cache[cxx] = out.stdout.splitlines()[0] if out.stdout else cxx
    return _version_cache[cxx]


class BuildResult:
    """A built library: its path and the kernels it exports."""

    def __init__(self, path: Path, kernels: list[Kernel]):
        self.path = path
        self.kernels = kernels


def _preprocess(cxx: str, source: str, filename: str, metal_version: int) -> str:
    text = f'# 1 "{filename}"\n' + strip_metal_includes(source)
    proc = subprocess.run(
        [cxx, "-E", "-x", "c++", "-std=c++20", f"-D__METAL_VERSION__={metal_version}",
         "-D__METAL__=1", "-"],
        input=text, capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        raise SyntaxError(f"preprocessing {filename} failed:\n{proc.stderr[-4000:]}")
    return proc.stdout


def plan(source: str, filename: str = "source.metal", metal_version: int = 310) -> tuple[str, list[Kernel], str]:
    """The C++ a build compiles, the kernels in it, and its cache key (nothing compiled)."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("the Metal emulator needs a C++20 compiler (g++); none found on PATH")
    cpp, kernels = translate(_preprocess(cxx, source, filename, metal_version))
    h = hashlib.sha256()
    for name in SHIM_FILES:
        h.update((HERE / name).read_bytes())
    h.update(cpp.encode())
    h.update(" ".join(CXXFLAGS).encode())
    h.update(_compiler_version(cxx).encode())
    return cpp, kernels, h.hexdigest()[:24]


def build(source: str, filename: str = "source.metal", metal_version: int = 310) -> BuildResult:
    """Compile `source` (MSL text) for the emulator; reuse a cached build if any."""
    cpp, kernels, key = plan(source, filename, metal_version)
    cxx = compiler()
    assert cxx is not None
    out_dir = cache_dir() / key
    lib = out_dir / "kernels.so"
    if lib.exists():
        return BuildResult(lib, kernels)
    out_dir.mkdir(parents=True, exist_ok=True)
    src_path = out_dir / "kernels.cpp"
    src_path.write_text(cpp)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    proc = subprocess.run(
        [cxx, *CXXFLAGS, f"-I{HERE}", str(src_path), "-o", tmp],
        capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        os.unlink(tmp)
        raise SyntaxError(f"compiling {filename} for the Metal emulator failed:\n{proc.stderr[-6000:]}")
    os.replace(tmp, lib)
    return BuildResult(lib, kernels)
