"""The command line: `opforge info` and `opforge verify` (run in this process)."""
from opforge.cli import main


def test_info(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "torch" in out and "triton" in out


def test_verify_quick_passes_and_prints_table(capsys):
    assert main(["verify", "--quick", "--ops", "layer_norm,add_rms_norm"]) == 0
    out = capsys.readouterr().out
    assert "triton" in out and "pass" in out and "FAIL" not in out
    assert "layer_norm" in out and "add_rms_norm" in out and "rms_norm " not in out.replace("add_rms_norm", "")
