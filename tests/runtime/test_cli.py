"""The command line: `opforge info` and `opforge verify` (run in this process)."""
from opforge.cli import main


def test_info(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "torch" in out and "triton" in out


def test_info_names_the_launch_settings(capsys, monkeypatch):
    from opforge.ops.attention import triton_kernels as attention_kernels
    from opforge.ops.quant import dense_gemv, triton_kernels
    monkeypatch.setattr(triton_kernels, "WIDE_K", False)
    monkeypatch.setattr(dense_gemv, "DENSE_GEMV", True)
    monkeypatch.setattr(triton_kernels, "DOT_SWAP", True)
    monkeypatch.setattr(triton_kernels, "DOT_JOIN", False)
    monkeypatch.setattr(attention_kernels, "DECODE_BY_LENGTH", False)
    from opforge.runtime import pdl
    monkeypatch.setattr(pdl, "ENABLED", False)
    assert main(["info"]) == 0
    launch = [line for line in capsys.readouterr().out.splitlines() if line.startswith("launch:")]
    assert len(launch) == 1
    assert "wide-K GEMV off (OPFORGE_QUANT_WIDE_K)" in launch[0] and "dense GEMV on (OPFORGE_DENSE_GEMV)" in launch[0]
    assert "swapped dot tiles on (OPFORGE_QUANT_SWAP)" in launch[0]
    assert "int4 join unpack off (OPFORGE_QUANT_JOIN)" in launch[0]
    assert "decode attention slices by length off (OPFORGE_DECODE_BY_LENGTH)" in launch[0]
    assert "programmatic dependent launch off on sm_90+ (OPFORGE_PDL)" in launch[0]


def test_verify_quick_passes_and_prints_table(capsys):
    assert main(["verify", "--quick", "--ops", "layer_norm,add_rms_norm"]) == 0
    out = capsys.readouterr().out
    assert "triton" in out and "pass" in out and "FAIL" not in out
    assert "layer_norm" in out and "add_rms_norm" in out and "rms_norm " not in out.replace("add_rms_norm", "")


def test_verify_help_describes_the_command_and_lists_the_op_names(capsys):
    import pytest
    from opforge.runtime import registry
    with pytest.raises(SystemExit) as exited:
        main(["verify", "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "compare each result with the float64 torch reference" in text
    names = text.split("op names for --ops: ")[1].split(", ")
    assert names == registry.ops() and "rms_norm" in names and "decode_attention" in names
