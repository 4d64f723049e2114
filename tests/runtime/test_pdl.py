"""Programmatic dependent launch (runtime/triton/pdl.py): off where it cannot work, and on an sm_90+ GPU
the same results bit for bit with it as without, through eager calls and CUDA graphs."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from opforge.runtime.triton import pdl
from opforge.runtime.triton.launch import TritonLauncher

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
CUDA_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


def test_off_on_cpu_and_under_the_interpreter(monkeypatch):
    assert pdl.on(torch.device("cpu")) is False
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert pdl.on(torch.device("cuda", 0)) is False


def test_launcher_finds_the_pdl_parameter():
    """Kernels with a ``PDL`` constexpr are the ones the launcher compiles with ``launch_pdl``."""
    from opforge.ops.norm import triton_kernels as nk
    from opforge.ops.quant import dense_gemv
    from opforge.ops.quant import triton_kernels as qk
    from opforge.ops.softmax import triton_kernels as sk
    for launcher in (nk._tile, nk._looped, qk._gemv, qk._qmm, qk._combine, dense_gemv._dense_gemv):
        if launcher.interpreted:
            pytest.skip("the interpreter's kernels have no parameter list")
        names = [p.name for p in launcher.kernel.params]
        assert launcher._pdl_at == names.index("PDL")
    assert sk._tile._pdl_at is None       # softmax does not take part (not in a decode step)


_STEPS = r"""
import json, sys, torch
from opforge.models.testing import tiny_decoder
from opforge.runtime.triton import pdl
from opforge.serve import generate
out = {"pdl": pdl.on(torch.device("cuda"))}


def captured(step):   # a CUDA graph of step() (warmed up off the capture) and its output tensor
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(), step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits = step()
    return graph, logits


for quant, batch in ((None, 1), ("int4", 1), ("int8", 2)):
    torch.manual_seed(0)
    m = tiny_decoder(device="cuda", dtype=torch.bfloat16, max_batch=2, max_seq_len=1024, quantize=quant,
                     group_size=32)
    ids = torch.randint(0, 64, (batch, 700), generator=torch.Generator().manual_seed(1))
    m.prefill(ids, torch.tensor([700] * batch))             # long enough for decode attention's splits
    tok = ids[:, -1].cuda()
    eager = m.decode_step(tok, m.cache_seqlens[:batch]).double()
    graph, logits = captured(lambda: m.decode_step(tok, m.cache_seqlens[:batch]))
    replays = []
    for _ in range(3):
        graph.replay()
        replays.append(logits.double().clone())
    tokens = generate(m, ids[:, :300].tolist(), 12)
    out[f"{quant} b{batch}"] = {"eager": eager.flatten().tolist(), "graph": [r.flatten().tolist() for r in replays],
                                "tokens": tokens}
print("RESULT " + json.dumps(out))
"""


def _run_steps(flag: str) -> dict:
    env = dict(os.environ, OPFORGE_PDL=flag, PYTHONPATH=os.path.join(ROOT, "src"))
    r = subprocess.run([sys.executable, "-c", _STEPS], capture_output=True, text=True, env=env, timeout=600)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stderr[-3000:]
    return json.loads(lines[-1][7:])


@pytest.mark.skipif(not CUDA_SM90, reason="needs an sm_90+ CUDA GPU")
def test_decode_steps_equal_with_and_without_pdl():
    """The tiny model's decode step (bf16, int4 and int8 weights, batch 1 and 2, a 700-token cache:
    norms, GEMVs with K splits, rotary + append, split decode attention and its merge), eager,
    replayed from a CUDA graph three times, and 12 greedy tokens: bit for bit the same in a process
    with PDL as in one without."""
    with_pdl, without = _run_steps("1"), _run_steps("0")
    assert with_pdl.pop("pdl") is True and without.pop("pdl") is False
    assert with_pdl.keys() == without.keys()
    for case in with_pdl:
        a, b = with_pdl[case], without[case]
        assert a["eager"] == b["eager"], case
        assert all(r == a["eager"] for r in a["graph"]), case       # replays equal the eager step
        assert a["graph"] == b["graph"] and a["tokens"] == b["tokens"], case
