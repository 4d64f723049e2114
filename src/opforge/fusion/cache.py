"""The on-disk side of the fusion cache: generated sources written as modules, then imported.

``@triton.jit`` reads its function's source from the file it was defined in, so a generated
kernel must live in a real file. Files are content-addressed (the name carries a hash of the
source), written atomically, and reused by later processes; Triton's own cache, keyed by the
same source, then skips the compilation too.

The directory is ``$OPFORGE_CACHE_DIR/fusion`` if set, else ``$XDG_CACHE_HOME/opforge/fusion``,
else ``~/.cache/opforge/fusion``; a temporary directory stands in when none is writable.

Example:
    >>> module = load_module("VALUE = 42\\n", "example")
    >>> module.VALUE
    42
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Optional

from ..runtime.lru import LRU

_modules: LRU[str, ModuleType] = LRU(256, "fusion.modules")
_fallback_dir: Optional[Path] = None


def cache_dir() -> Path:
    """Where generated kernels are written (not created until something is written).

    Example:
        >>> cache_dir().name
        'fusion'
    """
    root = os.environ.get("OPFORGE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "opforge")
    return Path(root) / "fusion"


def _write(directory: Path, filename: str, source: str) -> Path:
    path = directory / filename
    try:
        if path.read_text() == source:
            return path
    except OSError:
        pass
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(source)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def write_source(source: str, stem: str, suffix: str = ".py") -> Path:
    """Write ``source`` to ``<cache dir>/<stem>_<hash><suffix>`` (once) and return the path."""
    global _fallback_dir
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    filename = f"{stem}_{digest}{suffix}"
    try:
        return _write(cache_dir(), filename, source)
    except OSError:
        if _fallback_dir is None:
            _fallback_dir = Path(tempfile.mkdtemp(prefix="opforge-fusion-"))
        return _write(_fallback_dir, filename, source)


def load_module(source: str, stem: str) -> ModuleType:
    """Import ``source`` as a module from its cache file; identical sources share one module."""
    path = write_source(source, stem)
    name = "_opforge_fused_" + path.stem
    module = _modules.get(name)
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    _modules[name] = module
    return module
