"""The OpenAI-compatible server through the official ``openai`` client and httpx, on a real uvicorn server."""
import json
import threading
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from opforge.models import load
from opforge.serve import generate

from serving import MAX_MODEL_LEN, MODEL, ThreadServer, metric, model_dir

pytestmark = pytest.mark.cpu_only     # the HTTP side; the model runs on the CPU in every test here

PROMPTS = ["hello world", "the cat sat on the mat", "a", "what is 2 + 2?", "one two three four five six seven",
           "zzz", "lorem ipsum dolor sit amet, consectetur", "hi!", "abc abc abc abc", "the end.",
           "numbers 1234567890", "question: why?", "x y z", "a longer prompt that goes on for a while here",
           "ok", "final prompt"]


@pytest.fixture(scope="module")
def directory():
    return model_dir()


@pytest.fixture(scope="module")
def server(directory):
    with ThreadServer(directory) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tokenizer(directory):
    return Tokenizer.from_file(f"{directory}/tokenizer.json")


@pytest.fixture(scope="module")
def reference(directory):
    """Greedy token ids of a prompt from ``opforge.models``' own generate (no engine, no server)."""
    model = load(directory, device="cpu", dtype=__import__("torch").float32, max_seq_len=MAX_MODEL_LEN)
    return lambda ids, n: generate(model, ids, n)[0]


def sse(response: httpx.Response) -> list[str]:
    """The data fields of a server-sent event stream, in order."""
    return [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]


def answered(server) -> None:
    """The server still answers a normal request."""
    r = httpx.post(f"{server.url}/v1/completions", json={"model": MODEL, "prompt": "ok", "max_tokens": 2,
                                                          "temperature": 0}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


# ---- completions and chat ---------------------------------------------------------------------------
def test_completion_usage_and_tokens(client, tokenizer, reference):
    r = client.completions.create(model=MODEL, prompt="hello world", max_tokens=10, temperature=0,
                                  extra_body={"ignore_eos": True})
    ids = tokenizer.encode("hello world").ids
    assert r.usage.prompt_tokens == len(ids) == 12                     # <s> + 11 characters
    assert r.usage.completion_tokens == 10 and r.usage.total_tokens == 22
    assert r.choices[0].finish_reason == "length" and r.object == "text_completion" and r.model == MODEL
    assert r.choices[0].text == tokenizer.decode(reference(ids, 10))


def test_completion_from_token_ids(client, tokenizer, reference):
    ids = [1, 9, 16, 16, 19]
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == 5 and r.usage.completion_tokens == 6
    assert r.choices[0].text == tokenizer.decode(reference(ids, 6))


def test_chat_usage_counts_the_rendered_template(client, directory, tokenizer, reference):
    messages = [{"role": "system", "content": "be brief."}, {"role": "user", "content": "hi there"}]
    expected_ids = AutoTokenizer.from_pretrained(directory).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=7, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == len(expected_ids)
    assert r.usage.completion_tokens == 7 and r.choices[0].finish_reason == "length"
    assert r.choices[0].message.role == "assistant" and r.object == "chat.completion"
    assert r.choices[0].message.content == tokenizer.decode(reference(list(expected_ids), 7))


def test_chat_without_max_tokens_fills_the_context(client, directory):
    messages = [{"role": "user", "content": "go"}]
    n = len(AutoTokenizer.from_pretrained(directory).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False))
    r = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == MAX_MODEL_LEN - n and r.choices[0].finish_reason == "length"


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_stream_equals_whole(server, client, kind):
    common = dict(model=MODEL, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    if kind == "completion":
        whole = client.completions.create(prompt="stream me", **common)
        chunks = list(client.completions.create(prompt="stream me", stream=True,
                                                stream_options={"include_usage": True}, **common))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        whole_text = whole.choices[0].text
    else:
        messages = [{"role": "user", "content": "stream me"}]
        whole = client.chat.completions.create(messages=messages, **common)
        chunks = list(client.chat.completions.create(messages=messages, stream=True,
                                                     stream_options={"include_usage": True}, **common))
        assert chunks[0].choices[0].delta.role == "assistant"
        assert all(c.choices[0].delta.role is None for c in chunks[1:] if c.choices)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        whole_text = whole.choices[0].message.content
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == whole_text and reasons == [whole.choices[0].finish_reason] == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_ends_with_done_and_has_no_usage_unless_asked(server):
    body = {"model": MODEL, "prompt": "sse", "max_tokens": 5, "temperature": 0, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse(r)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["usage"] is None for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks].count("length") == 1


def test_stop_string_and_seeded_sampling(client):
    base = client.completions.create(model=MODEL, prompt="stop here", max_tokens=20, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    cut = base[3:5]
    stopped = client.completions.create(model=MODEL, prompt="stop here", max_tokens=20, temperature=0, stop=[cut],
                                        extra_body={"ignore_eos": True}).choices[0]
    assert stopped.finish_reason == "stop" and base.startswith(stopped.text) and cut not in stopped.text
    sampled = [client.completions.create(model=MODEL, prompt="seeded", max_tokens=16, temperature=1.0, seed=seed,
                                         top_p=0.9, extra_body={"ignore_eos": True}).choices[0].text
               for seed in (7, 7, 8)]
    assert sampled[0] == sampled[1] and sampled[0] != sampled[2]


def test_sixteen_concurrent_streams_equal_each_served_alone(client):
    def ask(i: int, stream: bool) -> tuple[str, int, str]:
        kw = dict(model=MODEL, prompt=PROMPTS[i], max_tokens=4 + 3 * i, temperature=0, extra_body={"ignore_eos": i % 2 == 0})
        if not stream:
            r = client.completions.create(**kw)
            return r.choices[0].text, r.usage.completion_tokens, r.choices[0].finish_reason
        chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
        reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert len(reasons) == 1
        return "".join(c.choices[0].text for c in chunks if c.choices), chunks[-1].usage.completion_tokens, reasons[0]

    alone = [ask(i, stream=False) for i in range(16)]
    together: list = [None] * 16
    start = threading.Barrier(16)

    def run(i: int) -> None:
        start.wait()
        together[i] = ask(i, stream=True)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert together == alone
    assert [n for _, n, _ in alone[::2]] == [4 + 3 * i for i in range(0, 16, 2)]


# ---- models, health, metrics ------------------------------------------------------------------------
def test_models_and_health(server, client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    health = httpx.get(f"{server.url}/health").json()
    assert health["status"] == "ok"


def test_metrics_parse_and_count(server, client):
    before = metric(server.url, 'opforge_requests_total{endpoint="completion",outcome="length"}')
    tokens_before = metric(server.url, "opforge_generation_tokens_total")
    client.completions.create(model=MODEL, prompt="count me", max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text)}
    for name in ("opforge_requests", "opforge_prompt_tokens", "opforge_generation_tokens",
                 "opforge_time_to_first_token_seconds", "opforge_inter_token_latency_seconds",
                 "opforge_requests_running", "opforge_requests_waiting", "opforge_kv_blocks_used",
                 "opforge_kv_blocks_free", "opforge_kv_blocks_cached", "opforge_prefix_cache_hits",
                 "opforge_prefix_cache_queries", "process_resident_memory_bytes"):
        assert name in families, name
    assert metric(server.url, 'opforge_requests_total{endpoint="completion",outcome="length"}') == before + 1
    assert metric(server.url, "opforge_generation_tokens_total") == tokens_before + 5
    assert metric(server.url, "opforge_time_to_first_token_seconds_count") >= 1
    assert metric(server.url, "opforge_kv_blocks_total") == 64


# ---- disconnects --------------------------------------------------------------------------------------
def test_disconnect_mid_stream_frees_the_blocks(server):
    server.wait_idle()
    aborted = metric(server.url, 'opforge_requests_total{endpoint="completion",outcome="abort"}')
    body = {"model": MODEL, "prompt": "a long answer please", "max_tokens": 70, "temperature": 0, "stream": True,
            "ignore_eos": True}
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{server.url}/v1/completions", json=body) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            assert metric(server.url, "opforge_kv_blocks_used") > 0
    server.wait_idle(timeout=5.0)
    assert metric(server.url, 'opforge_requests_total{endpoint="completion",outcome="abort"}') == aborted + 1
    answered(server)


def test_disconnect_while_waiting_for_a_whole_answer_aborts_the_request(directory):
    with ThreadServer(directory, start_engine=False) as s:       # the request waits: the engine is not stepping
        body = {"model": MODEL, "prompt": "x", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{s.url}/v1/completions", json=body, timeout=httpx.Timeout(60, read=0.5))
        s.wait_idle(timeout=5.0)                                  # gone from the queue without a step
        assert metric(s.url, 'opforge_requests_total{endpoint="completion",outcome="abort"}') == 1
        assert metric(s.url, "opforge_engine_steps_total") == 0
        s.engine.start()
        answered(s)


# ---- errors -------------------------------------------------------------------------------------------
LONG = "a" * (MAX_MODEL_LEN + 1)
ERRORS = [   # (path, body (bytes or JSON), status, param)
    ("/v1/completions", b"{not json", 400, None),
    ("/v1/completions", b"[1, 2]", 400, None),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "3"}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": 5}, 400, "prompt"),
    ("/v1/completions", {"prompt": "x"}, 400, "model"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": 3.0}, 400, "temperature"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 2}, 400, "n"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 2}, 400, "logprobs"),
    ("/v1/completions", {"model": MODEL, "prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": ["a", "b"]}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": [1, 2, 999]}, 400, "prompt"),
    ("/v1/completions", b"[" * 100000, 400, None),
    ("/v1/completions", b"\xff\xfe{", 400, None),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stop": [""]}, 400, "stop"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stop_token_ids": [-5]}, 400, "stop_token_ids"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 4, "min_tokens": 5}, 400, "min_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "seed": 2**64}, 400, "seed"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stream_options": {"include_usage": "yes"}}, 400,
     "stream_options.include_usage"),
    ("/v1/completions", {"model": MODEL, "prompt": LONG}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": MAX_MODEL_LEN}, 400, "max_tokens"),
    ("/v1/completions", {"model": "other", "prompt": "x"}, 404, "model"),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.0.role"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "tool", "content": "x"}]}, 400, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": LONG}]}, 400, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tools": [{}]}, 400, "tools"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     400, "messages.0.content"),
    ("/v1/chat/completions", {"model": "other", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
    ("/v1/nothing", {}, 404, None),
]


@pytest.mark.parametrize("path,body,status,param", ERRORS)
def test_error_paths_answer_openai_errors_and_the_server_goes_on(server, path, body, status, param):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(f"{server.url}{path}", content=content, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    answered(server)


def test_wrong_method_and_oversized_body(server):
    r = httpx.get(f"{server.url}/v1/completions")
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    big = json.dumps({"model": MODEL, "prompt": "a" * (server.config.max_body_bytes + 1)})
    r = httpx.post(f"{server.url}/v1/completions", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    answered(server)


def test_openai_client_raises_its_own_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="x")
    with pytest.raises(openai.BadRequestError, match="context"):
        client.completions.create(model=MODEL, prompt=LONG)


# ---- auth and the waiting queue ------------------------------------------------------------------------
def test_api_key(directory):
    with ThreadServer(directory, api_key="sesame") as s:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sesame"}):
            r = httpx.post(f"{s.url}/v1/completions", json=body, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
            assert httpx.get(f"{s.url}/v1/models", headers=headers).status_code == 401
        assert httpx.post(f"{s.url}/v1/completions", json=body, headers={"Authorization": "Bearer sesame"}).status_code == 200
        ok = openai.OpenAI(base_url=f"{s.url}/v1", api_key="sesame", max_retries=0)
        assert ok.completions.create(model=MODEL, prompt="x", max_tokens=2).usage.prompt_tokens == 2
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{s.url}/v1", api_key="wrong", max_retries=0).models.list()
        assert httpx.get(f"{s.url}/health").status_code == 200


def test_full_queue_answers_429_with_retry_after(directory):
    with ThreadServer(directory, max_num_seqs=1, max_waiting=2, start_engine=False) as s:
        body = {"model": MODEL, "prompt": "busy", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
        results: list = []
        waiting = [threading.Thread(target=lambda: results.append(httpx.post(f"{s.url}/v1/completions", json=body,
                                                                             timeout=120)))
                   for _ in range(2)]
        for t in waiting:
            t.start()
        deadline = time.monotonic() + 30
        while metric(s.url, "opforge_requests_waiting") != 2:     # the engine is not stepping yet
            assert time.monotonic() < deadline
            time.sleep(0.02)
        r = httpx.post(f"{s.url}/v1/completions", json=body)
        assert r.status_code == 429 and r.headers["retry-after"].isdigit()
        assert r.json()["error"]["type"] == "rate_limit_error" and r.json()["error"]["code"] == "queue_full"
        assert metric(s.url, 'opforge_requests_total{endpoint="completion",outcome="rejected"}') == 1
        s.engine.start()
        for t in waiting:
            t.join(120)
        assert [x.status_code for x in results] == [200, 200]
        assert [x.json()["usage"]["completion_tokens"] for x in results] == [8, 8]
        answered(s)


def test_a_stopped_engine_answers_503_and_the_http_side_stays_up(directory):
    with ThreadServer(directory) as s:
        answered(s)
        s.engine.shutdown()
        r = httpx.post(f"{s.url}/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
        assert httpx.get(f"{s.url}/v1/models").status_code == 200
