"""Where and with what a run was made: device, driver, library versions, date."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch


def pick_device(text: str | None) -> torch.device:
    """Resolve ``--device``: the best available if None, else validate the name.

    Raises ``ValueError`` with a readable message for an unknown or absent device.

    Example:
        >>> pick_device("cpu")
        device(type='cpu')
    """
    if text is None or text == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"unknown device {text!r}; use cuda, cuda:N, mps or cpu") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {text!r}: CUDA is not available on this machine")
        count = torch.cuda.device_count()
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        if index >= count:
            raise ValueError(f"device {text!r}: only {count} CUDA device(s) present")
        return torch.device("cuda", index)
    if dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ValueError(f"device {text!r}: MPS is not available on this machine")
        return dev
    if dev.type == "cpu":
        return dev
    raise ValueError(f"device {text!r}: unsupported device type {dev.type!r}; use cuda, mps or cpu")


def l2_bytes(device: torch.device) -> int:
    """Last-level cache size used to decide input rotation (a guess off CUDA).

    Example:
        >>> l2_bytes(torch.device("cpu"))
        33554432
    """
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return int(getattr(props, "L2_cache_size", 0) or 50 << 20)
    return 32 << 20


def _driver_version() -> str | None:
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        )
        return out.stdout.strip().splitlines()[0] or None
    except Exception:
        return None


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return None


def _git_commit() -> str | None:
    # The device machine gets a copy of the working tree without .git: let the caller say.
    if os.environ.get("OPFORGE_COMMIT"):
        return os.environ["OPFORGE_COMMIT"]
    root = Path(__file__).resolve().parents[3]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=True)
        return out.stdout.strip() or None
    except Exception:
        return None


def _device_info(device: torch.device) -> dict[str, Any] | None:
    try:
        import opforge

        info = opforge.device_info(device)
    except Exception:
        return None
    if dataclasses.is_dataclass(info) and not isinstance(info, type):
        return {k: _plain(v) for k, v in dataclasses.asdict(info).items() if not k.startswith("_")}
    return {"repr": repr(info)}


def _plain(v: Any) -> Any:
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return str(v)


def collect(device: torch.device) -> dict[str, Any]:
    """Metadata for the JSON report.

    Example:
        >>> collect(torch.device("cpu"))["device_type"]
        'cpu'
    """
    meta: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": str(device),
        "device_type": device.type,
        "device_name": platform.processor() or platform.machine(),
        "driver": None,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": _version("triton"),
        "liger_kernel": _version("liger-kernel") or _version("liger_kernel"),
        "opforge": _version("opforge"),
        "opforge_commit": _git_commit(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        meta.update(
            device_name=props.name,
            driver=_driver_version(),
            sm_count=props.multi_processor_count,
            capability=f"{props.major}.{props.minor}",
            memory_gib=round(props.total_memory / (1 << 30), 1),
            l2_mib=round(l2_bytes(device) / (1 << 20), 1),
        )
    elif device.type == "mps":
        meta["device_name"] = "Apple GPU (MPS)"
    meta["opforge_device_info"] = _device_info(device)
    return meta
