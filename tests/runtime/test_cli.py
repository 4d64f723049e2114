"""The command line: `opforge info` and `opforge verify` (run in this process)."""
from opforge.cli import main


def test_info(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "torch" in out and "triton" in out


def test_info_names_the_launch_settings_and_switches(capsys, monkeypatch):
    from opforge.runtime.triton import pdl
    monkeypatch.setattr(pdl, "ENABLED", False)
    monkeypatch.setenv("OPFORGE_STRICT", "0")
    monkeypatch.delenv("OPFORGE_CHECK_SEQLENS", raising=False)
    assert main(["info"]) == 0
    out = capsys.readouterr().out.splitlines()
    launch = [line for line in out if line.startswith("launch:")]
    assert len(launch) == 1
    assert "programmatic dependent launch off on sm_90+ (OPFORGE_PDL)" in launch[0]
    assert "(OPFORGE_PLANS)" in launch[0]
    switches = [line for line in out if line.startswith("switches:")]
    assert len(switches) == 1
    assert "OPFORGE_STRICT=0" in switches[0] and "OPFORGE_CHECK_SEQLENS=unset" in switches[0]
    for retired in ("OPFORGE_QUANT_TUNED", "OPFORGE_QUANT_WIDE_K", "OPFORGE_QUANT_SWAP", "OPFORGE_QUANT_JOIN",
                    "OPFORGE_DENSE_GEMV", "OPFORGE_DECODE_BY_LENGTH", "OPFORGE_CUDA_LAUNCH"):
        assert retired not in "\n".join(out)


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
