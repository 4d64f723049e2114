"""The registry, the built-in suites as they are defined, and the bytes formulas."""

from __future__ import annotations

import pytest
import torch

from opforge.bench.catalog import get_op, get_suite, op_names, suite_names
from opforge.bench.spec import CPU, LIGER, OPFORGE, TORCH, numel, parse_shape, shape_label


def test_shape_text_round_trip():
    assert parse_shape("8x128x768") == (8, 128, 768)
    assert shape_label((8, 128, 768)) == "8x128x768"
    for bad in ("", "8xx2", "0x4", "axb", "-1x3"):
        with pytest.raises(ValueError):
            parse_shape(bad)


def test_builtin_suites_match_their_definition():
    assert {"seed", "llm", "latency"} <= set(suite_names())
    assert {"layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"} <= set(op_names())

    seed = get_suite("seed")
    assert [e.op for e in seed.entries] == ["layer_norm", "rms_norm"]
    assert seed.entries[0].shapes == ((2, 32, 256), (8, 128, 768), (8, 128, 1024), (4, 64, 4096))
    assert set(seed.entries[0].dtypes) == {torch.float32, torch.float16, torch.bfloat16}
    assert CPU in seed.impls

    llm = get_suite("llm")
    assert [e.op for e in llm.entries] == ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"]
    assert llm.entries[0].shapes == ((32768, 1024), (16384, 4096), (8192, 8192), (4096, 16384),
                                     (2048, 32768), (1024, 65536), (262144, 128))
    assert set(llm.entries[0].dtypes) == {torch.bfloat16, torch.float16}
    assert len(llm.targets) == 2

    latency = get_suite("latency")
    assert latency.metric == "wall_us" and latency.chain_len == 10
    assert latency.entries[0].shapes == ((2, 32, 256), (8, 128, 768), (1, 1, 4096), (1, 1, 8192))
    assert {"softmax", "log_softmax", "silu", "swiglu"} <= {e.op for e in latency.entries}


@pytest.mark.parametrize("op,streams,vectors", [
    ("layer_norm", 2, 2), ("rms_norm", 2, 1), ("add_layer_norm", 4, 2), ("add_rms_norm", 4, 1),
])
def test_bytes_moved_counts_each_input_and_output_once(op, streams, vectors):
    shape, dt = (16, 64), torch.bfloat16
    spec = get_op(op)
    expected = (streams * numel(shape) + vectors * shape[-1]) * 2
    assert spec.bytes_moved(shape, dt) == expected
    # And it agrees with the tensors the op really reads and writes.
    g = torch.Generator().manual_seed(0)
    inputs = spec.make_inputs(shape, dt, torch.device("cpu"), g)
    read = sum(t.numel() * t.element_size() for t in inputs)
    written = (2 if op.startswith("add_") else 1) * numel(shape) * 2
    assert read + written == expected


def test_every_norm_op_has_the_standard_implementations():
    for op in ("layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"):
        spec = get_op(op)
        assert {OPFORGE, TORCH, LIGER, "torch.compile"} <= set(spec.impls)
        assert spec.feed is not None


def test_inputs_are_random_not_zeros():
    spec = get_op("add_layer_norm")
    x, r, w, b = spec.make_inputs((4, 32), torch.float32, torch.device("cpu"), torch.Generator().manual_seed(1))
    for t in (x, r, w, b):
        assert t.abs().sum() > 0 and t.std() > 0.1
