"""Bad checkpoints raise opforge.SafetensorsError naming the file and the tensor."""
from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import save_file

import opforge


def test_error_type_is_exported_and_a_value_error():
    assert issubclass(opforge.SafetensorsError, ValueError)
    assert opforge.SafetensorsError is opforge.io.SafetensorsError


def test_truncated_file_names_file_and_tensor(tmp_path):
    p = tmp_path / "t.safetensors"
    save_file({"a": torch.randn(10), "b": torch.randn(1000)}, str(p))
    p.write_bytes(p.read_bytes()[:-100])
    with pytest.raises(opforge.SafetensorsError, match=r"t\.safetensors.*'b'.*truncated") as e:
        opforge.load_safetensors(p)
    assert e.value.tensor == "b" and e.value.file == str(p)


def test_file_shorter_than_its_header(tmp_path):
    p = tmp_path / "t.safetensors"
    save_file({"a": torch.randn(10)}, str(p))
    p.write_bytes(p.read_bytes()[:20])
    with pytest.raises(opforge.SafetensorsError, match="corrupt header"):
        opforge.load_safetensors(p)
    p.write_bytes(b"\x01\x02")
    with pytest.raises(opforge.SafetensorsError, match="too short"):
        opforge.load_safetensors(p)


@pytest.mark.parametrize("header, data, message", [
    (b"not json at all", b"", "not JSON"),
    (b"[1, 2]", b"", "not a JSON object"),
    (b'{"a": {"dtype": "F32"}}', b"", "lacks dtype, shape or data_offsets"),
    (b'{"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}', b"\0" * 4, "bad shape"),
    (b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}', b"\0" * 4, r"needs 8 bytes but its data_offsets span 4"),
    (b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}',
     b"\0" * 8, "overlap"),
    (b'{"a": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}', b"\0" * 8, "unsupported dtype 'C64'"),
    (b'{"__metadata__": [1], "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', b"\0" * 4, "__metadata__"),
])
def test_corrupt_headers(tmp_path, header, data, message):
    p = tmp_path / "c.safetensors"
    p.write_bytes(struct.pack("<Q", len(header)) + header + data)
    with pytest.raises(opforge.SafetensorsError, match=message) as e:
        opforge.load_safetensors(p)
    assert e.value.file == str(p)


def test_header_length_beyond_file(tmp_path):
    p = tmp_path / "c.safetensors"
    p.write_bytes(struct.pack("<Q", 10**6) + b"{}")
    with pytest.raises(opforge.SafetensorsError, match="length 1000000 does not fit"):
        opforge.load_safetensors(p)


def test_missing_shard_and_misplaced_tensor(tmp_path):
    save_file({"a": torch.randn(3)}, str(tmp_path / "s1.safetensors"))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}))
    with pytest.raises(opforge.SafetensorsError, match=r"s2\.safetensors.*'b'.*missing shard"):
        opforge.load_safetensors(tmp_path)
    save_file({"c": torch.randn(3)}, str(tmp_path / "s2.safetensors"))
    with pytest.raises(opforge.SafetensorsError, match=r"'b'.*lacks it"):
        opforge.load_safetensors(tmp_path)
    save_file({"c": torch.randn(3), "x": torch.randn(2)}, str(tmp_path / "s2.safetensors"))
    index.write_text(json.dumps({"weight_map": {"a": "s1.safetensors", "c": "s1.safetensors", "x": "s2.safetensors"}}))
    with pytest.raises(opforge.SafetensorsError, match=r"s2\.safetensors: tensor 'c'.*index places"):
        opforge.load_safetensors(tmp_path)
    index.write_text("{broken")
    with pytest.raises(opforge.SafetensorsError, match="corrupt index"):
        opforge.load_safetensors(tmp_path)


def test_missing_file_and_empty_folder(tmp_path):
    with pytest.raises(opforge.SafetensorsError, match="not found"):
        opforge.load_safetensors(tmp_path / "nope.safetensors")
    with pytest.raises(opforge.SafetensorsError, match="neither"):
        opforge.load_safetensors(tmp_path)


def test_bad_arguments_raise_before_reading(tmp_path):
    with pytest.raises(ValueError, match="quantize must be"):
        opforge.load_safetensors(tmp_path / "x", quantize="int3")
    with pytest.raises(ValueError, match="dtype must be"):
        opforge.load_safetensors(tmp_path / "x", dtype=torch.int32)
    with pytest.raises(ValueError, match="group_size must be"):
        opforge.load_safetensors(tmp_path / "x", quantize="int4", group_size=100)
    with pytest.raises(ValueError, match="gptq_format must be"):
        opforge.load_safetensors(tmp_path / "x", gptq_format="v3")
