"""``opforge bench-serve`` (the server under load over HTTP): the workload, the statistics, and a tiny run on CPU."""
import asyncio
import json
import math

import pytest

from opforge.cli import main
from opforge.serve.loadgen import Record, ragged_workload, run_load, summarize

pytestmark = pytest.mark.cpu_only     # the HTTP side; the model runs on the CPU in every test here


def test_ragged_workload_is_seeded_and_in_range():
    w = ragged_workload(200, (64, 1024), (32, 256), vocab_size=128256, seed=3)
    assert w == ragged_workload(200, (64, 1024), (32, 256), vocab_size=128256, seed=3)
    assert w != ragged_workload(200, (64, 1024), (32, 256), vocab_size=128256, seed=4)
    lengths = [len(r.prompt) for r in w]
    assert min(lengths) >= 64 and max(lengths) <= 1024 and 400 < sum(lengths) / len(w) < 690
    assert all(32 <= r.max_tokens <= 256 and min(r.prompt) >= 100 and max(r.prompt) < 128256 for r in w)


def test_summary_statistics_against_a_direct_computation():
    records = [Record(10, n, ttft=0.01 * n, itl=[0.001 * n] * (n - 1), e2e=0.01 * n + 0.001 * n * (n - 1))
               for n in range(1, 101)] + [Record(5, error="HTTP 500")]
    s = summarize(records, seconds=2.0)
    assert s["requests"] == 101 and s["failed"] == 1 and s["errors"] == ["HTTP 500"]
    assert s["output_tokens"] == 5050 and s["output_tokens_per_s"] == 2525.0
    assert s["total_tokens_per_s"] == (5050 + 1000) / 2 and s["request_throughput"] == 50.0
    assert math.isclose(s["ttft_ms"]["p50"], 505.0) and math.isclose(s["ttft_ms"]["p99"], 990.1)
    assert math.isclose(s["ttft_ms"]["mean"], 505.0)
    assert all(math.isclose(s["tpot_ms"][k], v) for k, v in (("p50", 51.0), ("p90", 90.2)))   # TPOT = n ms for n >= 2
    itl = sorted(0.001 * n for n in range(1, 101) for _ in range(n - 1))
    assert math.isclose(s["itl_ms"]["mean"], 1000 * sum(itl) / len(itl))


def test_poisson_arrivals_spread_the_sends():
    sent = []

    async def send(r):
        sent.append(asyncio.get_running_loop().time())
        return Record(len(r.prompt), r.max_tokens, 0.0, [], 0.0)
    work = ragged_workload(40, (1, 2), (1, 1), 64)
    _, seconds = asyncio.run(run_load(work, send, rate=200.0, seed=1))
    gaps = [b - a for a, b in zip(sent, sent[1:])]
    assert 0.1 < seconds < 2.0 and 0.002 < sum(gaps) / len(gaps) < 0.02     # mean gap 1/200 s


def test_bench_serve_end_to_end_on_cpu(tmp_path, capsys):
    out = tmp_path / "serve.json"
    status = main(["bench-serve", "--random", "tiny", "--device", "cpu", "--num-requests", "6", "--warmup", "1",
                   "--prompt-len", "4:12", "--output-len", "2:6", "--concurrency", "3", "--offline",
                   "--max-model-len", "32", "--kv-blocks", "32", "--max-prefill-tokens-while-decoding", "4",
                   "--json", str(out)])
    assert status == 0
    rows = json.loads(out.read_text())["rows"]
    # all at once (256 in flight at most), 3 clients in process, all at once with 3 in flight, 3 clients over HTTP
    assert [(r["mode"], r["concurrency"], r.get("max_num_seqs")) for r in rows] == \
        [("offline-batch", None, 256), ("offline", 3, None), ("offline-batch", 3, 3), ("online", 3, None)]
    work = ragged_workload(6, (4, 12), (2, 6), 64, 0)
    for r in rows:
        assert r["failed"] == 0 and r["output_tokens"] == sum(w.max_tokens for w in work)
        assert r["ttft_ms"]["p50"] > 0 and r["e2e_ms"]["p99"] >= r["e2e_ms"]["p50"]
    online = rows[3]
    for key, ref in (("fraction_of_offline_output_tokens_per_s", rows[1]),
                     ("fraction_of_offline_batch_output_tokens_per_s", rows[0]),
                     ("fraction_of_offline_batch_same_in_flight_output_tokens_per_s", rows[2])):
        assert online[key] == online["output_tokens_per_s"] / ref["output_tokens_per_s"]
    printed = capsys.readouterr().out
    assert "online/offline" in printed and "of the offline batch's with max_num_seqs=3" in printed


def test_bench_serve_bad_arguments():
    for argv in (["--random", "tiny", "--num-requests", "0"], ["--random", "tiny", "--rate", "0"],
                 ["--url", "http://x", "--offline"], ["--random", "tiny", "--prompt-len", "9:3"]):
        with pytest.raises(SystemExit) as e:
            main(["bench-serve", *argv])
        assert e.value.code == 2
