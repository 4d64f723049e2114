"""GGUF files in: dense and quantized tensors through ``opforge.load_gguf``, and bad files
(truncated, wrong magic, unknown tensor type, a tensor past the end) refused with
``opforge.GGUFError`` naming the file and the tensor, before any tensor is decoded."""
from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

import opforge
from opforge.io import gguf as gguf_io

gguf = pytest.importorskip("gguf")


def _write(path, tensors):
    """tensors: name -> (array, ggml type name or None for the array's own dtype)."""
    w = gguf.GGUFWriter(str(path), "llama")
    for name, (array, kind) in tensors.items():
        if kind is None:
            w.add_tensor(name, array)
        else:
            qtype = gguf.GGMLQuantizationType[kind]
            w.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def good(tmp_path):
    rng = np.random.default_rng(0)
    return _write(tmp_path / "good.gguf", {
        "norm": (rng.standard_normal(64).astype(np.float32), None),
        "half": (rng.standard_normal((4, 64)).astype(np.float16), None),
        "w8": (rng.standard_normal((8, 64)).astype(np.float32), "Q8_0"),
        "w4": (rng.standard_normal((8, 64)).astype(np.float32), "Q4_0"),
        "w41": (rng.standard_normal((8, 64)).astype(np.float32), "Q4_1"),
    })


def test_dense_and_quantized_tensors_hold_the_files_values(good):
    got = opforge.load_gguf(good)
    reader = gguf.GGUFReader(str(good))
    for t in reader.tensors:
        dense_type = t.tensor_type.name in ("F32", "F16")
        ref = np.asarray(t.data) if dense_type else gguf.quants.dequantize(t.data, t.tensor_type)
        value = got[t.name]
        if isinstance(value, opforge.QuantizedWeight):
            tol = 0 if t.tensor_type.name in ("Q8_0", "Q4_0") else 1e-6
            assert value.group == 32 and value.bits == (8 if t.name == "w8" else 4)
            dense = value.dequantize(torch.float64).numpy()
            assert np.abs(dense - ref).max() <= tol * np.abs(ref).max(), t.name
        else:
            assert value.dtype == {"F32": torch.float32, "F16": torch.float16}[t.tensor_type.name]
            assert np.array_equal(value.numpy(), ref), t.name
    assert got["half"].shape == (4, 64) and got["w8"].shape == (8, 64)
    assert opforge.load_gguf(good, dtype=torch.bfloat16)["norm"].dtype == torch.bfloat16


def _tensor_info_at(data: bytes, name: str) -> int:
    """Offset of a tensor's (type u32, offset u64) pair in the header."""
    key = struct.pack("<Q", len(name)) + name.encode()
    at = data.index(key) + len(key)
    n_dims = struct.unpack_from("<I", data, at)[0]
    return at + 4 + 8 * n_dims


@pytest.fixture
def count_decodes(monkeypatch):
    calls = []
    real = gguf_io.decode_tensor
    monkeypatch.setattr(gguf_io, "decode_tensor", lambda *a, **k: calls.append(a[0].name) or real(*a, **k))
    return calls


def _corrupt(good, tmp_path, edit):
    data = bytearray(good.read_bytes())
    edit(data)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    return bad


def test_unknown_tensor_type_names_file_and_tensor(good, tmp_path, count_decodes):
    bad = _corrupt(good, tmp_path, lambda d: struct.pack_into("<I", d, _tensor_info_at(d, "w4"), 99))
    with pytest.raises(opforge.GGUFError, match=r"bad\.gguf: tensor 'w4': unknown tensor type 99") as e:
        opforge.load_gguf(bad)
    assert e.value.tensor == "w4" and e.value.file.endswith("bad.gguf")
    assert count_decodes == []                       # refused before any tensor was decoded


def test_tensor_past_the_end_names_it(good, tmp_path, count_decodes):
    bad = _corrupt(good, tmp_path, lambda d: struct.pack_into("<Q", d, _tensor_info_at(d, "w8") + 4, 1 << 20))
    with pytest.raises(opforge.GGUFError, match=r"tensor 'w8': the tensor's bytes .* past the end of the file"):
        opforge.load_gguf(bad)
    assert count_decodes == []


def test_truncated_file_names_the_tensor_it_cuts(good, tmp_path, count_decodes):
    data = good.read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[:-100])                       # the last tensor (w41) loses its tail
    with pytest.raises(opforge.GGUFError, match=r"cut\.gguf: tensor 'w41': .*past the end of the file"):
        opforge.load_gguf(bad)
    bad.write_bytes(data[:40])                         # inside the metadata
    with pytest.raises(opforge.GGUFError, match=r"cut\.gguf: unreadable header"):
        opforge.load_gguf(bad)
    assert count_decodes == []


def test_wrong_magic_and_missing_file(good, tmp_path):
    bad = _corrupt(good, tmp_path, lambda d: d.__setitem__(slice(0, 4), b"GGML"))
    with pytest.raises(opforge.GGUFError, match=r"bad\.gguf: not a GGUF file \(magic b'GGML'"):
        opforge.load_gguf(bad)
    with pytest.raises(FileNotFoundError):
        opforge.load_gguf(tmp_path / "absent.gguf")
    assert issubclass(opforge.GGUFError, opforge.SafetensorsError)


def test_unsupported_architecture_is_named(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "gpt2")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with pytest.raises(opforge.GGUFError, match=r"m\.gguf: architecture 'gpt2' .* not supported"):
        opforge.models.load(tmp_path / "m.gguf", device="cpu")
