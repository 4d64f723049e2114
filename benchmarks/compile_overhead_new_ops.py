"""Eager per-call cost of @compiled on the new op families (CPU, timeit): decorated vs .eager.

Run from the repository root: PYTHONPATH=src python benchmarks/compile_overhead_new_ops.py
"""
import sys, timeit, torch, opforge
sys.path.insert(0, "tests/hardening")
from test_compile_new_ops import _inputs, DELAYS
a = _inputs("cpu")
pos = a["lens"][:, None].long()
h = torch.randn(2, 64)
cases = {
    "attention": (opforge.attention, (a["q"], a["k_cache"], a["v_cache"]), {}),
    "decode_attention": (opforge.decode_attention, (a["q"], a["k_cache"], a["v_cache"], a["lens"]), {}),
    "rotary_embedding": (opforge.rotary_embedding, (a["q"], a["k"], a["cos"], a["sin"], pos), {}),
    "kv_cache_append": (opforge.kv_cache_append, (a["k_cache"], a["v_cache"], a["k"], a["v"], a["lens"]), {}),
    "rotary_kv_cache_append": (opforge.rotary_kv_cache_append,
                               (a["q"], a["k"], a["v"], a["k_cache"], a["v_cache"], a["lens"], a["cos"], a["sin"]), {}),
    "apply_delay": (opforge.apply_delay, (a["codes"], DELAYS), dict(bos_id=-1, pad_id=-2)),
    "revert_delay": (opforge.revert_delay, (a["codes"], DELAYS), dict(pad_id=-2)),
    "linear (dense)": (opforge.linear, (h, a["w"]), {}),
    "linear (int4)": (opforge.linear, (h, a["qw"]), {}),
}
print(f"{'op':24s} {'decorated us':>13s} {'undecorated us':>15s} {'overhead us':>12s}")
for name, (f, args, kw) in cases.items():
    for _ in range(200): f(*args, **kw)
    n = 3000
    res = []
    for fn in (f, f.eager):
        res.append(min(timeit.repeat(lambda: fn(*args, **kw), number=n, repeat=7)) / n * 1e6)
    print(f"{name:24s} {res[0]:13.2f} {res[1]:15.2f} {res[0]-res[1]:12.2f}")
# the wrapper alone, on a trivial body
from opforge.runtime.compile_support import compiled
def body(x: torch.Tensor) -> torch.Tensor: return x
w = compiled("bench_identity", lambda x: torch.empty_like(x))(body)
x = torch.ones(4)
n = 200000
t1 = min(timeit.repeat(lambda: w(x), number=n, repeat=7)) / n * 1e9
t0 = min(timeit.repeat(lambda: body(x), number=n, repeat=7)) / n * 1e9
print(f"wrapper on an identity body: {t1:.0f} ns vs {t0:.0f} ns undecorated ({t1-t0:.0f} ns)")

def body(x: torch.Tensor, k: torch.Tensor, c: torch.Tensor, s: torch.Tensor, p: torch.Tensor, *,
         interleaved: bool = False) -> torch.Tensor:
    return x
w = compiled("bench_identity5", lambda *a, **k: torch.empty_like(a[0]))(body)
x = torch.ones(4)
n = 200000
for _ in range(3):
    t1 = min(timeit.repeat(lambda: w(x, x, x, x, x, interleaved=False), number=n, repeat=9)) / n * 1e9
    t0 = min(timeit.repeat(lambda: body(x, x, x, x, x, interleaved=False), number=n, repeat=9)) / n * 1e9
    with torch.no_grad():
        t2 = min(timeit.repeat(lambda: w(x, x, x, x, x, interleaved=False), number=n, repeat=9)) / n * 1e9
    print(f"5 tensors + kwarg: grad mode {t1-t0:.0f} ns, no_grad {t2-t0:.0f} ns over undecorated {t0:.0f} ns")
