"""``opforge bench --suite model`` on CPU with the tiny shape (the GPU numbers come from the lead's run)."""
from __future__ import annotations

import io
import json
import sys
import types

import pytest

from opforge.bench.cli import main
from opforge.bench.suites import model as suite
from opforge.bench.suites import model_peers as peers_module

TINY_DECODES = ("decode b1 ctx24", "decode b1 ctx48", "decode b2 ctx24", "decode b2 ctx48")
TINY_PREFILLS = ("prefill 1x64", "prefill 2x32")


def test_model_suite_head_precisions_quantize_the_output_head(tmp_path):
    """"int4-head" quantizes the output head too: fewer weight bytes than "int4", no dense head."""
    path = tmp_path / "model.json"
    assert main(["--suite", "model", "--device", "cpu", "--shapes", "tiny", "--dtypes", "int4,int4-head",
                 "--impls", "opforge", "--json", str(path)]) == 0
    rows = {(r["precision"], r["what"]): r for r in json.loads(path.read_text())["rows"]}
    dense, quantized = rows[("int4", "decode b1 ctx24")], rows[("int4-head", "decode b1 ctx24")]
    assert quantized["weight_bytes"] < dense["weight_bytes"]
    assert dense["dense_lm_head_bytes"] > 0 and quantized["dense_lm_head_bytes"] == 0


def test_model_suite_runs_the_grid_and_writes_json(tmp_path, capsys):
    path = tmp_path / "model.json"
    assert main(["--suite", "model", "--device", "cpu", "--shapes", "tiny", "--dtypes", "bf16,int4",
                 "--impls", "opforge", "--json", str(path)]) == 0
    result = json.loads(path.read_text())
    rows = {(r["precision"], r["what"]): r for r in result["rows"]}
    assert set(rows) == {(p, w) for p in ("bf16", "int4") for w in TINY_DECODES + TINY_PREFILLS}
    assert all(r["impl"] == "opforge" and r["tokens_per_s"] > 0 for r in rows.values())
    assert rows[("int4", "decode b1 ctx24")]["weight_bytes"] < rows[("bf16", "decode b1 ctx24")]["weight_bytes"]
    for (p, what), r in rows.items():
        if what.startswith("decode"):
            assert 0 < r["pct_of_limit"] < r["pct_of_limit_with_kv"]     # the KV cache adds bytes read
            assert r["new_tokens"] == (8 if r["context"] == 24 else 6)
            assert r["kv_bytes_per_step"] > 0
    # the longer context reads more cache per step
    assert rows[("bf16", "decode b2 ctx48")]["kv_bytes_per_step"] > rows[("bf16", "decode b2 ctx24")]["kv_bytes_per_step"]
    assert result["copy_bandwidth_gbs"] > 0
    assert result["skipped"] == [] and result["peers"] == {} and result["budget_s"] is None
    assert result["grid"]["tiny"]["batches"] == [1, 2] and result["grid"]["tiny"]["prefills"] == ["1x64", "2x32"]
    printed = capsys.readouterr().out
    assert "prefill 2x32" in printed and "==== model suite ====" in printed


def test_model_suite_peers_report_results_failures_and_not_installed(monkeypatch):
    pytest.importorskip("transformers")
    from transformers.models.llama import modeling_llama
    calls = []
    original_rotary = modeling_llama.apply_rotary_pos_emb

    def fake_liger(model=None, **kwargs):        # stands in for Liger-Kernel: patches the module globally
        calls.append((type(model).__name__, kwargs))
        modeling_llama.apply_rotary_pos_emb = lambda *a, **k: original_rotary(*a, **k)
    liger = types.ModuleType("liger_kernel")
    liger.transformers = types.ModuleType("liger_kernel.transformers")
    liger.transformers.apply_liger_kernel_to_llama = fake_liger
    monkeypatch.setitem(sys.modules, "liger_kernel", liger)
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", liger.transformers)

    result = suite.run_model_suite(["tiny"], "cpu", ["bf16"], peers=["eager", "patch", "compile", "liger"],
                                   out=io.StringIO())
    by_impl: dict[str, dict[str, dict]] = {}
    for r in result["rows"]:
        by_impl.setdefault(r["impl"], {})[r["what"]] = r
    for impl in ("transformers (dynamic cache)", "transformers (static cache)",
                 "transformers+opforge.patch (dynamic cache)", "transformers+opforge.patch (static cache)",
                 "transformers+liger (dynamic cache)", "transformers+liger (static cache)"):
        assert set(by_impl[impl]) == set(TINY_DECODES), impl
        for r in by_impl[impl].values():   # a number, or a failure with its reason: never silently empty
            assert (r["tokens_per_s"] is not None and r["tokens_per_s"] > 0) or r["error"], (impl, r)
        assert sum(r["tokens_per_s"] is not None for r in by_impl[impl].values()) >= 2, impl
    for impl in ("transformers (eager)", "transformers+opforge.patch", "transformers+liger"):
        assert set(by_impl[impl]) == set(TINY_PREFILLS)
        assert all(r["tokens_per_s"] > 0 for r in by_impl[impl].values())
    assert calls == [("LlamaForCausalLM", {"rope": True, "rms_norm": True, "swiglu": True, "cross_entropy": False,
                                           "fused_linear_cross_entropy": False})]
    assert modeling_llama.apply_rotary_pos_emb is original_rotary      # Liger's global patch undone
    assert result["peers"]["tiny transformers+liger"] == "ok"
    assert result["peers"]["tiny transformers static cache + compile"] == "skipped: needs CUDA"
    assert result["skipped"] == [{"shape": "tiny", "impl": "transformers (static cache + compile)",
                                  "precision": "bf16", "what": "decode b1 ctx24", "reason": "needs CUDA"}]
    assert "replaced" in result["patch_report"]["tiny"]


def test_model_suite_liger_not_installed_is_reported(monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.setitem(sys.modules, "liger_kernel", None)              # import fails
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", None)
    buf = io.StringIO()
    result = suite.run_model_suite(["tiny"], "cpu", ["bf16"], peers=["liger"], out=buf, budget=None)
    assert result["peers"] == {"tiny transformers+liger": "not installed"}
    assert not any(r["impl"].startswith("transformers") for r in result["rows"])
    assert "transformers+liger: not installed" in buf.getvalue()


def test_model_suite_failing_peer_is_a_failure_not_a_crash(monkeypatch):
    pytest.importorskip("transformers")

    def broken(*args, **kwargs):
        raise RuntimeError("graph capture failed\nlong traceback text")
    monkeypatch.setattr(peers_module, "transformers_generate_seconds", broken)
    result = suite.run_model_suite(["tiny"], "cpu", ["bf16"], peers=["eager"], out=io.StringIO())
    decodes = [r for r in result["rows"] if r["impl"].startswith("transformers (") and r["what"].startswith("decode")]
    assert len(decodes) == 8
    assert all(r["tokens_per_s"] is None and r["error"] == "RuntimeError: graph capture failed" for r in decodes)
    prefills = [r for r in result["rows"] if r["impl"] == "transformers (eager)"]
    assert len(prefills) == 2 and all(r["tokens_per_s"] > 0 for r in prefills)


def test_model_suite_budget_zero_skips_everything_and_says_so(tmp_path, capsys):
    path = tmp_path / "model.json"
    assert main(["--suite", "model", "--device", "cpu", "--shapes", "tiny", "--dtypes", "bf16,int8",
                 "--budget", "0", "--json", str(path)]) == 0
    result = json.loads(path.read_text())
    assert result["rows"] == [] and result["budget_s"] == 0
    skipped = {(s["impl"], s["precision"], s["what"]) for s in result["skipped"]}
    assert {("opforge", p, w) for p in ("bf16", "int8") for w in TINY_DECODES + TINY_PREFILLS} <= skipped
    assert ("transformers (dynamic cache)", "bf16", "decode b2 ctx48") in skipped
    assert all(s["reason"] == "budget" for s in result["skipped"])
    out = capsys.readouterr().out
    assert f"skipped: {len(result['skipped'])} points" in out and "checkpoint written" not in out


def test_model_suite_budget_stops_midway(monkeypatch):
    allowed = iter([True] * 4)      # the budget runs out after four checks: shape, load, two points
    monkeypatch.setattr(suite.Budget, "allows", lambda self, need_s=0.0: next(allowed, False))
    result = suite.run_model_suite(["tiny"], "cpu", ["bf16", "int4"], peers=False, out=io.StringIO(), budget=1e9)
    measured = [(r["precision"], r["what"]) for r in result["rows"]]
    assert measured == [("bf16", "decode b1 ctx24"), ("bf16", "decode b1 ctx48")]
    assert all(r["tokens_per_s"] > 0 for r in result["rows"])
    skipped = [(s["precision"], s["what"]) for s in result["skipped"]]
    assert len(measured) + len(skipped) == 2 * 6 and not set(measured) & set(skipped)
    assert skipped[0] == ("bf16", "decode b2 ctx24") and ("int4", "prefill 2x32") in skipped


def test_model_suite_refuses_unknown_shapes_peers_and_mixing(capsys):
    assert main(["--suite", "model", "--device", "cpu", "--shapes", "70b"]) == 2
    assert "unknown shape" in capsys.readouterr().err
    assert main(["--suite", "model", "--device", "cpu", "--shapes", "tiny", "--impls", "vllm"]) == 2
    assert "unknown peer" in capsys.readouterr().err
    assert main(["--suite", "model", "--device", "cpu", "--budget", "-1"]) == 2
    assert main(["--suite", "model,seed", "--device", "cpu"]) == 2


def test_grid_of_the_1b_shape_is_the_full_grid():
    g = suite.grid("1b")
    assert g.decode_points() == [(b, c) for b in (1, 8, 32) for c in (512, 4096)]
    assert g.prefills == ((1, 2048), (8, 512)) and g.max_batch == 32 and g.max_seq_len >= 4096 + 32
    assert (g.new_tokens(512), g.new_tokens(4096), g.peer_new_tokens(512), g.peer_new_tokens(4096)) == (64, 32, 32, 16)


def test_model_suite_compiled_peer_runs_through_torch_compile(monkeypatch):
    pytest.importorskip("transformers")
    import torch
    monkeypatch.setattr(peers_module, "COMPILE_BACKEND_OFF_CUDA", "eager")   # CUDA: inductor, reduce-overhead
    torch._dynamo.reset()
    result = suite.run_model_suite(["tiny"], "cpu", ["bf16"], peers=["compile"], out=io.StringIO())
    rows = [r for r in result["rows"] if r["impl"] == "transformers (static cache + compile)"]
    assert [r["what"] for r in rows] == ["decode b1 ctx24"]
    assert rows[0].get("error") is None and rows[0]["tokens_per_s"] > 0 and rows[0]["new_tokens"] == 8
    assert result["peers"] == {"tiny transformers static cache + compile": "ok"} and result["skipped"] == []
    from torch._dynamo.utils import counters
    assert counters["stats"]["unique_graphs"] > 0


def test_model_suite_compiled_peer_that_did_not_compile_is_a_failure(monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.setattr(peers_module, "COMPILE_BACKEND_OFF_CUDA", "eager")
    monkeypatch.setattr(peers_module, "_compiled_graphs", lambda: 7)      # as if torch.compile never produced a graph
    result = suite.run_model_suite(["tiny"], "cpu", ["bf16"], peers=["compile"], out=io.StringIO())
    (row,) = [r for r in result["rows"] if r["impl"] == "transformers (static cache + compile)"]
    assert row["tokens_per_s"] is None and "did not compile" in row["error"]


def test_static_cache_length_is_forgotten_between_points():
    class Model:
        pass
    hf = Model()
    hf._previous_max_cache_length, hf._cache, hf.keep = 4114, object(), 1
    peers_module._forget_static_cache(hf)
    assert vars(hf) == {"keep": 1}
    peers_module._forget_static_cache(hf)                                  # nothing left to drop: no error


def test_generate_seconds_measure_again_when_one_call_is_noise():
    """One timed call each, unless the decode steps vanish in noise: then medians of five."""
    import time

    import torch
    from opforge.bench.suites.model_peers import transformers_generate_seconds

    class Noisy:   # the first four calls (warm-ups and one timed call per length) all take 20 ms
        calls = 0

        def generate(self, ids, max_new_tokens=1, **kwargs):
            self.calls += 1
            time.sleep(0.02 if self.calls <= 4 else 0.005 + 0.002 * max_new_tokens)
            return ids

    model = Noisy()
    t_one, t_all = transformers_generate_seconds(model, torch.zeros(1, 4, dtype=torch.long), 8,
                                                 torch.device("cpu"), warmup_tokens=0)
    assert model.calls == 4 + 12 and t_all - t_one > 0.01
