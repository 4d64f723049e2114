"""The command line end to end on the CPU: outputs, JSON contents, re-rendering, bad arguments."""

from __future__ import annotations

import json

import pytest

from opforge.bench.cli import main
from opforge.bench.results import RunResult


@pytest.mark.parametrize("argv,needle", [
    (["--suite", "nope"], "unknown suite"),
    (["--ops", "softmax_that_does_not_exist"], "unknown op"),
    (["--impls", "tensorflow"], "unknown implementation"),
    (["--dtypes", "fp8"], "unknown dtype"),
    (["--device", "banana"], "unknown device"),
    (["--device", "cuda:99"], "cuda:99"),
    (["--shapes", "8xx2"], "bad shape"),
    (["--suite", "seed", "--ops", "add_rms_norm"], "not in suite"),
    (["--plot", "out.jpg"], "must end with"),
    (["--reps", "0"], "--reps"),
    (["--from-json", "/does/not/exist.json"], "cannot read"),
    (["--no-such-flag"], "unrecognized"),
])
def test_bad_arguments_exit_2_with_a_clear_message(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error" in err and needle in err


def test_help_and_list_exit_0(capsys):
    assert main(["--help"]) == 0
    assert "--suite" in capsys.readouterr().out
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "seed" in out and "llm" in out and "latency" in out and "rms_norm" in out


def test_end_to_end_on_cpu_writes_json_markdown_and_plots(tmp_path, capsys):
    j, md, png = tmp_path / "r.json", tmp_path / "r.md", tmp_path / "bw.png"
    argv = ["--device", "cpu", "--suite", "seed,latency", "--ops", "rms_norm,add_rms_norm", "--shapes", "2x16",
            "--dtypes", "fp32", "--impls", "opforge,torch,liger,torch-cpu", "--reps", "2", "--progress", "none",
            "--json", str(j), "--markdown", str(md), "--plot", str(png)]
    assert main(argv) in (0, 1)  # 1 only if opforge itself were wrong
    data = json.loads(j.read_text())
    meta = data["meta"]
    for key in ("device_name", "driver", "torch", "triton", "date", "cuda"):
        assert key in meta
    assert data["copy_gbps"] > 0
    seed, latency = data["suites"]
    assert [c["op"] for c in seed["cases"]] == ["rms_norm"]  # add_rms_norm is not a seed op
    case = seed["cases"][0]
    assert case["results"]["liger"]["status"] == "absent" and case["results"]["liger"]["reason"]
    assert case["results"]["liger"]["gpu_us"] is None
    assert case["results"]["torch"]["status"] == "ok" and case["results"]["torch"]["gpu_us"] > 0
    assert case["results"]["opforge"]["status"] in ("ok", "absent")
    assert latency["chains"] and latency["metric"] == "wall_us"
    text = md.read_text()
    assert "## seed" in text and "## latency" in text and "| rms_norm | 2x16 | fp32 |" in text
    assert (tmp_path / "bw-seed.png").stat().st_size > 1000
    assert (tmp_path / "bw-latency.png").stat().st_size > 1000
    out = capsys.readouterr().out
    assert "seed" in out and "wrote" in out

    # A saved run renders again without measuring.
    again = tmp_path / "again.md"
    assert main(["--from-json", str(j), "--compact", "--markdown", str(again)]) in (0, 1)
    assert again.read_text() == text
    assert "opforge GPU time, speedup vs torch" in capsys.readouterr().out


def test_json_round_trip(tmp_path):
    j = tmp_path / "r.json"
    assert main(["--device", "cpu", "--suite", "seed", "--ops", "layer_norm", "--shapes", "2x8",
                 "--dtypes", "fp32", "--impls", "torch", "--reps", "1", "--progress", "none",
                 "--no-table", "--json", str(j)]) == 0
    run = RunResult.load_json(j)
    assert run.to_dict() == json.loads(j.read_text())


def test_decode_gemv_suite_runs_its_three_weights_against_cublas_peers(tmp_path):
    """The decode_gemv suite on CPU (one small shape): dense, int4 and int8 weights, opforge and
    torch each checked against float64 and timed."""
    from opforge.bench.catalog import get_suite
    suite = get_suite("decode_gemv")
    assert [e.op for e in suite.entries] == ["linear_dense", "linear_int4_g128", "linear_int8"]
    assert all(len(e.shapes) == 9 and all(m == 1 for m, _, _ in e.shapes) for e in suite.entries)
    j = tmp_path / "g.json"
    argv = ["--device", "cpu", "--suite", "decode_gemv", "--shapes", "1x48x256", "--reps", "2",
            "--progress", "none", "--json", str(j)]
    assert main(argv) == 0
    cases = json.loads(j.read_text())["suites"][0]["cases"]
    assert [c["op"] for c in cases] == ["linear_dense", "linear_int4_g128", "linear_int8"]
    for case in cases:
        for impl in ("opforge", "torch"):
            assert case["results"][impl]["status"] == "ok" and case["results"][impl]["gpu_us"] > 0, case


def test_fusion_suite_runs_the_fused_chain_against_eager(tmp_path):
    """The fusion suite on CPU (one small shape): the fused chain and torch eager, each checked
    against float64 and timed."""
    from opforge.bench.catalog import get_suite
    assert [e.op for e in get_suite("fusion").entries] == ["bias_gelu_residual"]
    j = tmp_path / "f.json"
    argv = ["--device", "cpu", "--suite", "fusion", "--shapes", "8x64", "--dtypes", "fp32", "--impls",
            "opforge,torch", "--reps", "2", "--progress", "none", "--json", str(j)]
    assert main(argv) == 0
    case = json.loads(j.read_text())["suites"][0]["cases"][0]
    assert case["op"] == "bias_gelu_residual" and case["bytes"] == (3 * 8 * 64 + 64) * 4
    for impl in ("opforge", "torch"):
        assert case["results"][impl]["status"] == "ok" and case["results"][impl]["gpu_us"] > 0, case
        assert case["results"][impl]["rel_err"] < 1e-5


def test_rope_suite_runs_rotary_against_the_torch_composite(tmp_path):
    """The rope suite on CPU (one small shape): opforge and the torch composite, each checked
    against float64 and timed."""
    j = tmp_path / "r.json"
    argv = ["--device", "cpu", "--suite", "rope", "--shapes", "1x4x2x8x16", "--dtypes", "fp32", "--impls",
            "opforge,torch", "--reps", "2", "--progress", "none", "--json", str(j)]
    assert main(argv) == 0
    case = json.loads(j.read_text())["suites"][0]["cases"][0]
    assert case["op"] == "rotary_embedding" and case["bytes"] == 2 * 1 * 6 * 8 * 16 * 4 + 2 * 8 * 8 * 4 + 8 * 8
    for impl in ("opforge", "torch"):
        assert case["results"][impl]["status"] == "ok" and case["results"][impl]["gpu_us"] > 0, case
        assert case["results"][impl]["rel_err"] < 1e-5
