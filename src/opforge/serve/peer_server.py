"""transformers' own server (``transformers serve``) as a peer for ``opforge bench-serve --peer transformers``.

The peer serves the same checkpoint directory with transformers' continuous batching
(``--continuous-batching``) on a free loopback port; the bench sends it the same workload at the
same settings. Its OpenAI API takes text prompts only, so each prompt of token ids is sent as a
text that the checkpoint's tokenizer turns into exactly as many tokens (``prompt_texts``), and
``eos_token_id: -1`` in the request's ``generation_config`` (transformers' "no end of sequence")
stands in for ``ignore_eos``. Token counts come from the ``usage`` of each stream's closing chunk.

A random checkpoint has no tokenizer: ``write_id_tokenizer`` writes one whose token ``i`` is the
word ``t<i>``, so a prompt of ids is the words joined by spaces.

``python -m opforge.serve.peer_server MODEL_DIR ARGS`` runs ``transformers serve`` preloading
MODEL_DIR with ARGS; without the ``accelerate`` package (which ``transformers serve`` needs to
place a model with ``device_map``) the model is loaded on the CPU and moved to ``--device``.

Example:
    >>> import tempfile
    >>> from transformers import AutoTokenizer
    >>> directory = write_id_tokenizer(tempfile.mkdtemp(), vocab_size=300)
    >>> tokenizer = AutoTokenizer.from_pretrained(directory)
    >>> text = prompt_texts(tokenizer, [[201, 7, 299]])[0]
    >>> text, tokenizer(text)["input_ids"]
    ('t201 t7 t299', [201, 7, 299])
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import httpx

from .loadgen import free_port

#: the chat template of the id tokenizer: the messages' contents, nothing added
ID_CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


class PeerServerError(RuntimeError):
    """The peer server could not be started, or the checkpoint cannot be served by it."""


def write_id_tokenizer(directory: str, vocab_size: int) -> str:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``directory``: token ``i`` is the
    word ``t<i>`` (words split on whitespace, no special tokens added), with a chat template that
    renders the messages' contents only. Returns ``directory``.

    Example:
        >>> import os, tempfile
        >>> sorted(os.listdir(write_id_tokenizer(tempfile.mkdtemp(), vocab_size=8)))
        ['tokenizer.json', 'tokenizer_config.json']
    """
    if vocab_size < 1:
        raise PeerServerError(f"vocab_size must be >= 1, got {vocab_size}")
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": {f"t{i}": i for i in range(vocab_size)}, "unk_token": "t0"},
    }
    with open(os.path.join(directory, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f)
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": ID_CHAT_TEMPLATE}, f)
    return directory


def prompt_texts(tokenizer: Any, prompts: Sequence[Sequence[int]], tries: int = 8) -> list[str]:
    """A text per prompt that ``tokenizer(text)`` (special tokens included, as the peer's
    completions endpoint calls it) turns into as many tokens as the prompt has ids, where a few
    decode / re-encode passes find one; otherwise the closest found (the peer's ``usage`` then
    tells the real count).

    Example:
        >>> import tempfile
        >>> from transformers import AutoTokenizer
        >>> tokenizer = AutoTokenizer.from_pretrained(write_id_tokenizer(tempfile.mkdtemp(), vocab_size=64))
        >>> prompt_texts(tokenizer, [[5, 6], [63]])
        ['t5 t6', 't63']
    """
    out = []
    for ids in prompts:
        target, content = len(ids), list(ids)
        best, best_miss = "", None
        for _ in range(tries):
            text = tokenizer.decode(content)
            miss = len(tokenizer(text)["input_ids"]) - target
            if best_miss is None or abs(miss) < abs(best_miss):
                best, best_miss = text, miss
            if miss == 0:
                break
            content = content[:max(1, len(content) - miss)] if miss > 0 else content + list(ids[:-miss])
        out.append(best)
    return out


@dataclass
class PeerServer:
    """A running peer: its process, base URL, the model name its requests carry, the endpoint
    the bench sends to (``/v1/completions``, or ``/v1/chat/completions`` where the installed
    transformers has no completions endpoint), and its log file."""

    process: subprocess.Popen
    url: str
    model: str
    endpoint: str
    log_path: str
    load_seconds: float

    def log_tail(self, lines: int = 30) -> str:
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM (uvicorn's graceful stop), then SIGKILL after ``timeout_s``; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def start_transformers_server(model_dir: str, device: str, dtype: str = "auto", extra_args: Sequence[str] = (),
                              timeout_s: float = 900.0) -> PeerServer:
    """Start ``transformers serve MODEL_DIR --continuous-batching`` on a free loopback port and wait
    until ``/health`` answers (newer versions load the model before they listen). Raises
    ``PeerServerError`` with the log's tail when it exits or does not answer within ``timeout_s``.
    """
    if not os.path.isfile(os.path.join(model_dir, "tokenizer.json")) and \
            not os.path.isfile(os.path.join(model_dir, "tokenizer_config.json")):
        raise PeerServerError(f"model_dir {model_dir!r} has no tokenizer; transformers serve needs one")
    port = free_port()
    model = os.path.abspath(model_dir)
    cmd = [sys.executable, "-m", "opforge.serve.peer_server", model, "--continuous-batching", "--device", device,
           "--dtype", dtype, "--host", "127.0.0.1", "--port", str(port), *extra_args]
    log_fd, log_path = tempfile.mkstemp(prefix="transformers-serve-", suffix=".log")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_DISABLE_UPDATE_CHECK="1", TRANSFORMERS_OFFLINE="1")
    start = time.perf_counter()
    with os.fdopen(log_fd, "w") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    peer = PeerServer(process, url, model, "/v1/completions", log_path, 0.0)
    while True:
        if process.poll() is not None:
            raise PeerServerError(f"transformers serve exited with {process.returncode}:\n{peer.log_tail()}")
        if time.perf_counter() - start > timeout_s:
            peer.stop(10)
            raise PeerServerError(f"transformers serve did not answer within {timeout_s:.0f} s:\n{peer.log_tail()}")
        try:       # listening: newer versions load the model first, older ones at the first request
            if httpx.get(f"{url}/health", timeout=2.0).status_code < 500:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    peer.load_seconds = time.perf_counter() - start
    try:
        paths = httpx.get(f"{url}/openapi.json", timeout=10.0).json().get("paths", {})
    except (httpx.HTTPError, ValueError):
        paths = {}
    if "/v1/completions" not in paths and "/v1/chat/completions" in paths:
        peer.endpoint = "/v1/chat/completions"
    return peer


def _place_without_accelerate() -> None:
    """Make ``from_pretrained(..., device_map=DEVICE)`` load without ``device_map`` (which needs
    ``accelerate``) and move the model to DEVICE itself."""
    import torch
    from transformers import modeling_utils

    load = modeling_utils.PreTrainedModel.from_pretrained.__func__

    def load_then_move(cls: Any, *args: Any, **kwargs: Any) -> Any:
        device = kwargs.pop("device_map", None)
        model = load(cls, *args, **kwargs)
        if device is None:
            return model
        if isinstance(device, int):
            device = f"cuda:{device}"
        elif device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        return model.to(device)
    modeling_utils.PreTrainedModel.from_pretrained = classmethod(load_then_move)


def serve_argv(model_dir: str, args: Sequence[str]) -> list[str]:
    """``transformers serve``'s arguments for the installed transformers: the model to preload is
    its first positional argument in newer versions, ``--force-model`` in older ones.

    Example:
        >>> serve_argv("/ckpt", ["--port", "8001"])[-3:]
        ['/ckpt', '--port', '8001']
    """
    import inspect

    from transformers.cli.serve import Serve
    annotation = inspect.signature(Serve.__init__).parameters["force_model"].annotation
    positional = "ArgumentInfo" in repr(annotation) or "typer.Argument" in repr(annotation)
    return ["serve", model_dir, *args] if positional else ["serve", "--force-model", model_dir, *args]


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``transformers serve`` with ``MODEL_DIR ARGS...``, placing the model itself where ``accelerate`` is missing."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        raise PeerServerError("usage: python -m opforge.serve.peer_server MODEL_DIR [transformers serve options]")
    if importlib.util.find_spec("accelerate") is None:
        _place_without_accelerate()
    from transformers.cli.transformers import app
    sys.argv = ["transformers", *serve_argv(argv[0], argv[1:])]
    app()


if __name__ == "__main__":
    main()
