"""Test support: a tiny checkpoint with a tokenizer and chat template, and a real uvicorn server
on a free loopback port (in a thread, or as an ``opforge serve`` process)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from typing import Any, Optional

import httpx
import torch
import uvicorn

from opforge.models.testing import write_tiny_checkpoint
from opforge.serve.api import ServerConfig, create_app
from opforge.serve.loadgen import free_port
from opforge.serve.chat_template import load_chat_template
from opforge.serve.cli import build_engine

from tiny_tokenizer import write_tokenizer

MODEL = "tiny"
MAX_MODEL_LEN = 96


def model_dir() -> str:
    """A tiny random Llama checkpoint with tokenizer.json and tokenizer_config.json (chat template)."""
    return write_tokenizer(write_tiny_checkpoint())


class ThreadServer:
    """``create_app`` served by uvicorn in a background thread; ``url`` once started."""

    def __init__(self, directory: str, *, kv_blocks: int = 64, max_num_seqs: int = 32, start_engine: bool = True,
                 device: str = "cpu", **config: Any):
        self.engine = build_engine(directory, device=device, dtype=torch.float32, max_model_len=MAX_MODEL_LEN,
                                   kv_blocks=kv_blocks, max_num_seqs=max_num_seqs)
        self.config = ServerConfig(model_name=MODEL, chat_template=load_chat_template(directory), **config)
        self.start_engine = start_engine     # False: the test starts it (requests wait until then)
        self.app = create_app(self.engine, self.config, manage_engine=False)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "ThreadServer":
        if self.start_engine:
            self.engine.start()
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def wait_idle(self, timeout: float = 30.0) -> None:
        wait_idle(self.url, timeout)

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(60)
        self.engine.shutdown()


def metric(url: str, name: str, headers: Optional[dict] = None) -> float:
    """One sample's value from /metrics (``name`` may carry labels as Prometheus writes them)."""
    text = httpx.get(f"{url}/metrics", headers=headers).text
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def wait_idle(url: str, timeout: float = 30.0) -> None:
    """Until /metrics shows no request running or waiting and no KV block in use."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (metric(url, "opforge_kv_blocks_used") == 0 and metric(url, "opforge_requests_running") == 0
                and metric(url, "opforge_requests_waiting") == 0):
            return
        time.sleep(0.05)
    raise AssertionError(f"the server did not return to idle within {timeout} s")


def start_process(directory: str, *args: str, env: Optional[dict] = None,
                  device: str = "cpu") -> tuple[subprocess.Popen, str, str]:
    """``python -m opforge serve DIR --port P ...``; returns the process, its URL and its ready line."""
    port = free_port()
    cmd = [sys.executable, "-m", "opforge", "serve", directory, "--port", str(port), "--device", device,
           "--dtype", "float32", "--kv-blocks", "64", "--max-model-len", str(MAX_MODEL_LEN),
           "--served-model-name", MODEL, *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})})
    lines = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("opforge serve: http://"):
            threading.Thread(target=proc.stdout.read, daemon=True).start()   # keep the pipe drained
            return proc, f"http://127.0.0.1:{port}", line
    proc.kill()
    raise RuntimeError("opforge serve did not start:\n" + "".join(lines))
