"""``opforge serve`` as a process: the ready line, the API key from the environment, SIGTERM."""
import json
import signal
import threading
import time

import httpx
import pytest

from opforge.cli import main

from serving import MODEL, model_dir, start_process

pytestmark = pytest.mark.cpu_only     # the HTTP side; the model runs on the CPU in every test here


@pytest.fixture(scope="module")
def directory():
    return model_dir()


def _stream(url: str, body: dict, out: list) -> None:
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=dict(body, stream=True), timeout=120) as r:
            out.append([line[6:] for line in r.iter_lines() if line.startswith("data: ")])
    except httpx.HTTPError as e:
        out.append(e)


def test_ready_line_and_api_key_from_the_environment(directory):
    proc, url, ready = start_process(directory, env={"OPFORGE_API_KEY": "k3y"})
    try:
        assert f"{url}/v1" in ready and f"model '{MODEL}'" in ready and "kernels: torch" in ready
        assert "KV cache: 64 blocks of 16 tokens = 1024 tokens" in ready and "API key required" in ready
        body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
        assert httpx.post(f"{url}/v1/completions", json=body).status_code == 401
        r = httpx.post(f"{url}/v1/completions", json=body, headers={"Authorization": "Bearer k3y"})
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


def test_sigterm_lets_running_requests_finish_then_exits_0(directory):
    proc, url, _ = start_process(directory, "--drain-timeout", "60")
    try:
        out: list = []
        body = {"model": MODEL, "prompt": "drain", "max_tokens": 80, "temperature": 0, "ignore_eos": True}
        reader = threading.Thread(target=_stream, args=(url, body, out))
        reader.start()
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/health").json()["running"] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        reader.join(120)
        events = out[0]
        assert events[-1] == "[DONE]"
        reasons = [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-1]]
        assert reasons.count("length") == 1 and reasons[-1] == "length"
        assert proc.wait(60) == 0
        with pytest.raises(httpx.ConnectError):           # no longer accepting
            httpx.get(f"{url}/health")
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigterm_aborts_what_outlives_the_drain_timeout(directory):
    proc, url, _ = start_process(directory, "--drain-timeout", "1", "--max-num-seqs", "1")
    try:
        outs: list = []
        body = {"model": MODEL, "prompt": "slow", "max_tokens": 90, "temperature": 0, "ignore_eos": True}
        readers = [threading.Thread(target=_stream, args=(url, body, outs)) for _ in range(32)]
        for r in readers:
            r.start()
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/health").json()["running"] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert time.monotonic() - signalled < 30
        for r in readers:
            r.join(60)
        complete = [o for o in outs if isinstance(o, list) and o and o[-1] == "[DONE]"]
        assert len(outs) == 32 and len(complete) < 32    # the queue outlived the drain timeout and was cut
    finally:
        if proc.poll() is None:
            proc.kill()


def test_bad_arguments_exit_2(directory, capsys):
    for argv in (["serve", "/no/such/dir"], ["serve", directory, "--max-num-seqs", "0"],
                 ["serve", directory, "--kv-memory-fraction", "1.5"], ["serve", directory, "--quantize", "int3"],
                 ["serve", directory, "--max-prefill-tokens-while-decoding", "-1"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
    assert "--kv-memory-fraction must be in (0, 1]" in capsys.readouterr().err


@pytest.mark.parametrize("given, bound", [([], 512), (["--max-prefill-tokens-while-decoding", "0"], None),
                                          (["--max-prefill-tokens-while-decoding", "64"], 64)])
def test_the_server_bounds_prefill_beside_decodes_by_default(directory, monkeypatch, given, bound):
    built = {}

    class Built(Exception):
        pass

    def build_engine(*args, **kwargs):
        built.update(kwargs)
        raise Built

    monkeypatch.setattr("opforge.serve.cli.build_engine", build_engine)
    with pytest.raises(Built):
        main(["serve", directory, "--device", "cpu", *given])
    assert built["max_prefill_tokens_while_decoding"] == bound
