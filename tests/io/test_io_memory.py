"""Host memory while loading: grows by about one tensor beyond what the result holds, never by
the file (measured in a fresh process: VmHWM, the peak resident set, against VmRSS before)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import save_file

MB = 1 << 20

_CHILD = textwrap.dedent("""
    import json, sys, torch, opforge

    def status(field):
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        raise KeyError(field)

    path, dtype = sys.argv[1], sys.argv[2]
    torch.empty(1)  # settle torch's own start-up allocations before the baseline
    with open("/proc/self/clear_refs", "w") as f:  # reset VmHWM to the current resident set
        f.write("5")
    base = status("VmRSS")
    out = opforge.load_safetensors(path, dtype=None if dtype == "none" else getattr(torch, dtype))
    held = sum(t.numel() * t.element_size() for t in out.values())
    print(json.dumps({"growth": status("VmHWM") - base, "held": held}))
""")


def _peak_growth(path, dtype: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", _CHILD, str(path), dtype], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc to measure peak RSS")
def test_peak_host_memory_grows_by_one_tensor_beyond_the_result(tmp_path):
    largest = 48 * MB
    state = {"big": torch.randn(largest // 2 // 1024, 1024, dtype=torch.bfloat16)}
    for i in range(8):
        state[f"layer{i}.weight"] = torch.randn(19 * MB // 2 // 512, 512, dtype=torch.bfloat16)
    path = tmp_path / "m.safetensors"
    save_file(state, str(path))
    file_bytes = os.path.getsize(path)
    assert file_bytes > 190 * MB
    del state
    # same dtype: bytes are read straight into the returned tensors
    same = _peak_growth(path, "none")
    assert same["held"] > 190 * MB
    assert same["growth"] - same["held"] <= 0.5 * largest + 16 * MB, same
    # bf16 -> fp32: each tensor's raw bytes live until it is converted, one at a time
    wider = _peak_growth(path, "float32")
    assert wider["held"] == 2 * same["held"]
    print("same dtype:", same, "bf16->fp32:", wider, "largest:", largest)
    assert wider["growth"] - wider["held"] <= 1.5 * largest + 16 * MB, wider
    # the excess is about one tensor, far from the file's size
    assert wider["growth"] - wider["held"] < 0.5 * file_bytes
