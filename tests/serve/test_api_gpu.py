"""The server on a CUDA engine (Triton kernels, CUDA graphs): answers, exact usage, streaming,
and a disconnect that frees its blocks."""
import httpx
import openai
import pytest

from serving import MODEL, ThreadServer, metric, model_dir

pytestmark = pytest.mark.gpu


def test_server_on_cuda():
    with ThreadServer(model_dir(), device="cuda") as s:
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0)
        whole = client.completions.create(model=MODEL, prompt="hello world", max_tokens=12, temperature=0,
                                          extra_body={"ignore_eos": True})
        assert whole.usage.prompt_tokens == 12 and whole.usage.completion_tokens == 12
        chunks = list(client.completions.create(model=MODEL, prompt="hello world", max_tokens=12, temperature=0,
                                                stream=True, extra_body={"ignore_eos": True}))
        assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
        body = {"model": MODEL, "prompt": "go", "max_tokens": 80, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", f"{s.url}/v1/completions", json=body, timeout=60) as r:
            assert next(r.iter_lines()).startswith("data: ")
        s.wait_idle(timeout=10)
        assert metric(s.url, "opforge_kv_blocks_free") == metric(s.url, "opforge_kv_blocks_total")
