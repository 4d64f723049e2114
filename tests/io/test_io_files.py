"""Reading plain SafeTensors checkpoints: values, dtypes, sharding, skip, into, progress."""
from __future__ import annotations

import io
import json
import os

import pytest
import torch
from safetensors.torch import save_file
from safetensors import safe_open

import opforge
from opforge.io.progress import LoadProgress


def _random_state() -> dict:
    return {
        "model.embed_tokens.weight": torch.randn(50, 16, dtype=torch.bfloat16),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(16, 16, dtype=torch.float16),
        "model.layers.0.input_layernorm.weight": torch.rand(16) + 0.5,
        "model.layers.0.mlp.up_proj.bias": torch.randn(32, dtype=torch.float64),
        "positions": torch.randint(-2**40, 2**40, (7,), dtype=torch.int64),
        "mask": torch.rand(3, 5) > 0.5,
        "small": torch.randint(-128, 128, (4, 2), dtype=torch.int8),
        "codes": torch.randint(0, 256, (9,), dtype=torch.uint8),
        "scalar": torch.tensor(3.25),
        "empty": torch.empty(0, 4),
    }


def test_reads_what_safetensors_wrote_bit_exactly(tmp_path):
    state = _random_state()
    path = tmp_path / "m.safetensors"
    save_file(state, str(path))
    got = opforge.load_safetensors(path)
    assert set(got) == set(state)
    for name, t in state.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert torch.equal(got[name], t), name


def test_dtype_converts_floating_tensors_only(tmp_path):
    state = _random_state()
    save_file(state, str(tmp_path / "m.safetensors"))
    got = opforge.load_safetensors(tmp_path / "m.safetensors", dtype=torch.float32)
    for name, t in state.items():
        want = t.to(torch.float32) if t.dtype.is_floating_point else t
        assert got[name].dtype == want.dtype, name
        assert torch.equal(got[name], want), name


def _write_sharded(folder, state: dict, shards: int = 3) -> None:
    names = list(state)
    weight_map = {}
    for s in range(shards):
        part = {n: state[n] for n in names[s::shards]}
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(part, str(folder / fname))
        weight_map.update({n: fname for n in part})
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))


def test_sharded_folder_and_index_path(tmp_path):
    state = _random_state()
    _write_sharded(tmp_path, state)
    for path in (tmp_path, tmp_path / "model.safetensors.index.json"):
        got = opforge.load_safetensors(path)
        assert set(got) == set(state)
        for name, t in state.items():
            assert torch.equal(got[name], t), name


def test_folder_with_single_file(tmp_path):
    state = {"a": torch.randn(3, 4), "b": torch.randn(5)}
    save_file(state, str(tmp_path / "model.safetensors"))
    got = opforge.load_safetensors(str(tmp_path))
    assert torch.equal(got["a"], state["a"]) and torch.equal(got["b"], state["b"])


def test_skip_names_patterns_and_callable(tmp_path):
    state = {"a.inv_freq": torch.randn(4), "b.inv_freq": torch.randn(4), "c.weight": torch.randn(2, 2),
             "d.bias": torch.randn(2)}
    save_file(state, str(tmp_path / "m.safetensors"))
    p = tmp_path / "m.safetensors"
    assert set(opforge.load_safetensors(p, skip="*.inv_freq")) == {"c.weight", "d.bias"}
    assert set(opforge.load_safetensors(p, skip=["c.weight", "a.*"])) == {"b.inv_freq", "d.bias"}
    assert set(opforge.load_safetensors(p, skip=lambda n: n.endswith("bias"))) == set(state) - {"d.bias"}
    got = opforge.load_safetensors(p, skip="*.inv_freq")
    assert torch.equal(got["c.weight"], state["c.weight"])


def test_into_dict_and_module(tmp_path):
    lin = torch.nn.Linear(8, 4)
    src = {"weight": torch.randn(4, 8), "bias": torch.randn(4)}
    save_file(src, str(tmp_path / "m.safetensors"))
    target = {"other": torch.ones(1)}
    opforge.load_safetensors(tmp_path / "m.safetensors", into=target)
    assert set(target) == {"other", "weight", "bias"} and torch.equal(target["weight"], src["weight"])
    opforge.io.load_into(lin, tmp_path / "m.safetensors")
    assert torch.equal(lin.weight.detach(), src["weight"]) and torch.equal(lin.bias.detach(), src["bias"])


def test_into_module_applies_nothing_on_a_shape_mismatch(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    bad = {"0.weight": torch.randn(4, 8), "0.bias": torch.randn(4), "1.weight": torch.randn(2, 5),
           "1.bias": torch.randn(2)}
    save_file(bad, str(tmp_path / "m.safetensors"))
    with pytest.raises(opforge.SafetensorsError, match=r"1\.weight.*shape \(2, 5\)") as e:
        opforge.load_safetensors(tmp_path / "m.safetensors", into=model)
    assert e.value.tensor == "1.weight" and e.value.file.endswith("m.safetensors")
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), f"{k} was changed although the load failed"


def test_into_strict_reports_missing_and_unexpected(tmp_path):
    model = torch.nn.Linear(3, 2)
    save_file({"weight": torch.randn(2, 3)}, str(tmp_path / "a.safetensors"))
    with pytest.raises(opforge.SafetensorsError, match="bias"):
        opforge.load_safetensors(tmp_path / "a.safetensors", into=model)
    save_file({"weight": torch.randn(2, 3), "bias": torch.randn(2), "extra": torch.randn(1)},
              str(tmp_path / "b.safetensors"))
    with pytest.raises(opforge.SafetensorsError, match="extra"):
        opforge.load_safetensors(tmp_path / "b.safetensors", into=model)
    opforge.load_safetensors(tmp_path / "b.safetensors", into=model, strict=False)


def test_into_dict_unchanged_when_a_file_is_bad(tmp_path):
    state = {"a": torch.randn(100), "b": torch.randn(100)}
    _write_sharded(tmp_path, state, shards=2)
    shard = tmp_path / "model-00002-of-00002.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[:-10])
    target = {}
    with pytest.raises(opforge.SafetensorsError, match="truncated"):
        opforge.load_safetensors(tmp_path, into=target)
    assert target == {}


def test_progress_bar_counts_tensors_and_bytes(tmp_path, capsys):
    state = {f"t{i}": torch.randn(64) for i in range(5)}
    save_file(state, str(tmp_path / "m.safetensors"))
    opforge.load_safetensors(tmp_path / "m.safetensors", progress=True)
    err = capsys.readouterr().err
    assert "5/5 tensors" in err and f"{5 * 64 * 4 / 1e9:.2f} GB" in err
    opforge.load_safetensors(tmp_path / "m.safetensors")  # stderr is not a terminal: quiet
    assert capsys.readouterr().err == ""


def test_progress_waits_for_slow_loads_in_a_terminal():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    fast = Tty()
    p = LoadProgress(2, 10, stream=fast, delay=60.0)
    p.advance(5), p.advance(5), p.close()
    assert fast.getvalue() == ""
    slow = Tty()
    p = LoadProgress(2, 10, stream=slow, delay=0.0)
    p.advance(5), p.advance(5), p.close()
    assert "2/2 tensors" in slow.getvalue()


def test_saved_file_opens_in_safetensors(tmp_path):
    state = {"x": torch.randn(3, 4, dtype=torch.bfloat16), "y": torch.arange(5)}
    view = torch.randn(6, 6)[:, :3]  # not contiguous
    state["v"] = view
    opforge.save_safetensors(state, tmp_path / "s.safetensors", metadata={"note": "hi"})
    with safe_open(str(tmp_path / "s.safetensors"), framework="pt") as f:
        assert f.metadata()["note"] == "hi"
        for k, t in state.items():
            assert torch.equal(f.get_tensor(k), t), k


def test_save_refuses_other_values_and_reserved_metadata(tmp_path):
    with pytest.raises(TypeError, match="state\\['a'\\]"):
        opforge.save_safetensors({"a": [1, 2]}, tmp_path / "x.safetensors")
    with pytest.raises(ValueError, match="reserved"):
        opforge.save_safetensors({"a": torch.ones(1)}, tmp_path / "x.safetensors", metadata={"opforge.x": "1"})
    assert not os.path.exists(tmp_path / "x.safetensors")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the pinned staging path)")
def test_cuda_load_matches_through_staging(tmp_path, monkeypatch):
    from opforge.io import reader
    monkeypatch.setattr(reader, "CHUNK_BYTES", 1 << 20)  # many chunks per tensor, both buffers reused
    state = {"big": torch.randn(3000, 1000, dtype=torch.bfloat16), "odd": torch.randn(12345),
             "i": torch.arange(10)}
    save_file(state, str(tmp_path / "m.safetensors"))
    got = opforge.load_safetensors(tmp_path / "m.safetensors", device="cuda", dtype=torch.float16)
    assert got["big"].device.type == "cuda"
    assert torch.equal(got["big"].cpu(), state["big"].to(torch.float16))
    assert torch.equal(got["odd"].cpu(), state["odd"].to(torch.float16))
    assert torch.equal(got["i"].cpu(), state["i"])


def test_saver_writes_every_dtype_shared_and_scalar_tensors_for_safetensors(tmp_path):
    shared = torch.randn(4, 4)
    state = {k: v for k, v in _random_state().items()}
    state.update({"shared_a": shared, "shared_b": shared, "shared_row": shared[1]})
    p = tmp_path / "all.safetensors"
    opforge.save_safetensors(state, p)
    with open(p, "rb") as f:
        assert int.from_bytes(f.read(8), "little") % 8 == 0  # data 8-byte aligned
    with safe_open(str(p), framework="pt") as f:
        assert set(f.keys()) == set(state)
        for k, t in state.items():
            got = f.get_tensor(k)
            assert got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t), k
    back = opforge.load_safetensors(p)
    for k, t in state.items():
        assert torch.equal(back[k], t), k


def test_saver_refuses_dtypes_without_a_code_and_leaves_no_file(tmp_path):
    with pytest.raises(TypeError, match="complex64"):
        opforge.save_safetensors({"a": torch.ones(1), "z": torch.ones(2, dtype=torch.complex64)},
                                 tmp_path / "z.safetensors")
    assert list(tmp_path.iterdir()) == []
