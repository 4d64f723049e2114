"""``opforge bench --suite serve`` end to end on a CPU (tiny shape, shrunk workloads)."""
import json

from opforge.bench.cli import main
from opforge.bench.suites.serve import workloads


def test_the_serve_suite_runs_and_writes_json(tmp_path, capsys):
    out = tmp_path / "serve.json"
    code = main(["--suite", "serve", "--quick", "--device", "cpu", "--ops", "batch1,shared-prefix",
                 "--impls", "opforge,static", "--json", str(out)])
    assert code == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["workload"], r["impl"]) for r in rows] == [("batch1", "opforge"), ("shared-prefix", "opforge"),
                                                          ("batch1", "static"), ("shared-prefix", "static")]
    assert all(r["tokens_per_s"] > 0 and "error" not in r for r in rows)
    assert rows[0]["generated"] == 32 and rows[1]["prefix_hit_rate"] > 0.5 and rows[0]["overlapped_steps"] > 0
    assert "x static" in capsys.readouterr().out


def test_bad_serve_arguments_exit_2(capsys):
    assert main(["--suite", "serve", "--impls", "nope", "--device", "cpu"]) == 2
    assert main(["--suite", "serve,norm"]) == 2
    assert "nope" in capsys.readouterr().err


def test_workloads_are_fixed_by_their_seeds():
    a, b = workloads(1000), workloads(1000)
    assert [w.prompts for w in a] == [w.prompts for w in b]
    ragged = {w.name: w for w in a}["ragged-64"]
    assert len(ragged.prompts) == 64 and all(64 <= len(p) <= 1024 for p in ragged.prompts)
    assert all(32 <= n <= 256 for n in ragged.outputs)
    shared = {w.name: w for w in a}["shared-prefix"]
    assert len({tuple(p[:1024]) for p in shared.prompts}) == 1 and len({tuple(p) for p in shared.prompts}) == 64
