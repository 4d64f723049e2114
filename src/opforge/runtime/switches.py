"""The environment switches the runtime reads on every call (not once at import).

Example:
    >>> import os
    >>> os.environ["OPFORGE_EXAMPLE_FLAG"] = "1"; env_flag("OPFORGE_EXAMPLE_FLAG")
    True
"""
from __future__ import annotations

import os


def env_flag(name: str) -> bool:
    """Whether the environment variable ``name`` is set to something other than empty, 0 or false."""
    return os.environ.get(name, "") not in ("", "0", "false", "False")


def triton_interpreting() -> bool:
    """True when Triton kernels run in Triton's CPU interpreter (``TRITON_INTERPRET=1``)."""
    return env_flag("TRITON_INTERPRET")


def metal_emulating() -> bool:
    """True when Metal kernels run in the CPU emulator (``OPFORGE_METAL_EMULATE=1``)."""
    return env_flag("OPFORGE_METAL_EMULATE")
