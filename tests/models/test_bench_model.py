"""``opforge bench --suite model`` on CPU with the tiny shape (the GPU numbers come from the lead's run)."""
from __future__ import annotations

import json

from opforge.bench.cli import main


def test_model_suite_runs_and_writes_json(tmp_path, capsys):
    path = tmp_path / "model.json"
    assert main(["--suite", "model", "--device", "cpu", "--shapes", "tiny", "--dtypes", "bf16,int4",
                 "--json", str(path)]) == 0
    result = json.loads(path.read_text())
    rows = {(r["precision"], r["what"]): r for r in result["rows"]}
    whats = ("decode b1 ctx24", "decode b2 ctx24", "prefill 1x64")
    assert set(rows) == {(p, w) for p in ("bf16", "int4") for w in whats}
    assert all(r["tokens_per_s"] > 0 for r in rows.values())
    assert rows[("int4", "decode b1 ctx24")]["weight_bytes"] < rows[("bf16", "decode b1 ctx24")]["weight_bytes"]
    assert result["copy_bandwidth_gbs"] > 0
    assert "prefill 1x64" in capsys.readouterr().out


def test_model_suite_refuses_unknown_shapes_and_mixing(capsys):
    assert main(["--suite", "model", "--device", "cpu", "--shapes", "70b"]) == 2
    assert "unknown shape" in capsys.readouterr().err
    assert main(["--suite", "model,seed", "--device", "cpu"]) == 2
