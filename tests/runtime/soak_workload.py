"""Every public op on a given shape, with its float64 reference: the soak and thread tests' workload."""
import torch
import torch.nn.functional as F

import opforge


def _rms(s, w):
    return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _ln(s, w, b):
    return F.layer_norm(s, (s.shape[-1],), w, b, 1e-5)


# name -> (run(x, r, w, b), reference(x, r, w, b) in float64); tuple outputs compare elementwise
OPS = {
    "layer_norm": (lambda x, r, w, b: opforge.layer_norm(x, w, b), lambda x, r, w, b: _ln(x, w, b)),
    "rms_norm": (lambda x, r, w, b: opforge.rms_norm(x, w), lambda x, r, w, b: _rms(x, w)),
    "add_layer_norm": (lambda x, r, w, b: opforge.add_layer_norm(x, r, w, b),
                       lambda x, r, w, b: (_ln(x + r, w, b), x + r)),
    "add_rms_norm": (lambda x, r, w, b: opforge.add_rms_norm(x, r, w), lambda x, r, w, b: (_rms(x + r, w), x + r)),
    "softmax": (lambda x, r, w, b: opforge.softmax(x), lambda x, r, w, b: torch.softmax(x, -1)),
    "log_softmax": (lambda x, r, w, b: opforge.log_softmax(x, dim=0), lambda x, r, w, b: torch.log_softmax(x, 0)),
    "gelu": (lambda x, r, w, b: opforge.gelu(x, "tanh"), lambda x, r, w, b: F.gelu(x, approximate="tanh")),
    "silu": (lambda x, r, w, b: opforge.silu(x), lambda x, r, w, b: F.silu(x)),
    "relu": (lambda x, r, w, b: opforge.relu(x), lambda x, r, w, b: F.relu(x)),
    "swiglu": (lambda x, r, w, b: opforge.swiglu(x, r), lambda x, r, w, b: F.silu(x) * r),
    "geglu": (lambda x, r, w, b: opforge.geglu(x, r), lambda x, r, w, b: F.gelu(x) * r),
}
NAMES = sorted(OPS)


def inputs(rows: int, n: int, device: str, dtype: torch.dtype, generator: torch.Generator):
    make = lambda *s: torch.randn(*s, generator=generator, dtype=torch.float32).to(device, dtype)  # noqa: E731
    return make(rows, n), make(rows, n), make(n), make(n)


def run(name: str, args):
    return OPS[name][0](*args)


def reference(name: str, args):
    return OPS[name][1](*(a.double() for a in args))


def as_tuple(out):
    return out if isinstance(out, tuple) else (out,)
