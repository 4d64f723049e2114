"""``opforge serve MODEL_DIR``: the OpenAI-compatible server on one model.

Binds 127.0.0.1:8000 unless told otherwise. SIGTERM (or Ctrl-C) stops accepting connections,
lets running requests finish for ``--drain-timeout`` seconds, aborts what is left, and exits 0.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import threading
from collections import Counter
from typing import Any, Iterator, Optional, Sequence

import torch

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: The server's bound on prompt tokens in a step that also decodes (``--max-prefill-tokens-while-
#: decoding``; the engine itself has none). H100, 1B bf16, 256 ragged requests from 32 streaming
#: clients, two runs each (results/h100/2026-11-27-0d676f5): inter-token latency p99 / p50 3.0x
#: and 3.3x unbounded (a step that prefills a whole 1024-token prompt takes ~10 ms), 2.1x and
#: 2.4x at 512 for 4.4% fewer tokens/s, 1.7x at 256 for 10% fewer; 1024: 3.0x and 3.8x.
SERVER_PREFILL_WHILE_DECODING = 512


def prefill_bound(value: Optional[int]) -> Optional[int]:
    """The engine's ``max_prefill_tokens_while_decoding`` for a ``--max-prefill-tokens-while-decoding``
    value: the server's default when not given, None (no bound) for 0.

    Example:
        >>> prefill_bound(None), prefill_bound(0), prefill_bound(2048)
        (512, None, 2048)
    """
    return (SERVER_PREFILL_WHILE_DECODING if value is None else value) or None


def load_for_serving(model_dir: str, *, device: Optional[str] = None, dtype: Optional[torch.dtype] = None,
                     quantize: Optional[str] = None, max_model_len: Optional[int] = None) -> tuple[Any, Any]:
    """Load a checkpoint directory (or a file ``opforge.models.load`` reads, such as GGUF) for an
    ``Engine``: the model, its ``max_seq_len`` = ``max_model_len`` (default: the checkpoint's
    context, capped at 8192 tokens; 4096 for a file), and its tokenizer (the model's, else the
    directory's ``tokenizer.json``; None without one: token-id prompts only).

    Example:
        >>> import torch
        >>> from opforge.models.testing import write_tiny_checkpoint
        >>> model, tokenizer = load_for_serving(write_tiny_checkpoint(), device="cpu", dtype=torch.float32)
        >>> model.max_seq_len, tokenizer is None
        (256, True)
    """
    from ..models import load
    from .tokenizer import load_tokenizer
    if max_model_len is None:
        max_model_len = 4096
        if os.path.isdir(model_dir):
            import json
            with open(os.path.join(model_dir, "config.json")) as f:
                max_model_len = min(int(json.load(f).get("max_position_embeddings") or 8192), 8192)
    model = load(model_dir, device=device, dtype=dtype, quantize=quantize, max_seq_len=max_model_len, max_batch=1)
    return model, getattr(model, "tokenizer", None) or load_tokenizer(model_dir)


def build_engine(model_dir: str, *, device: Optional[str] = None, dtype: Optional[torch.dtype] = None,
                 quantize: Optional[str] = None, max_num_seqs: int = 256, max_model_len: Optional[int] = None,
                 kv_memory_fraction: float = 0.9, kv_blocks: Optional[int] = None, block_size: int = 16,
                 **engine_kwargs: Any) -> Any:
    """Load a checkpoint directory with ``load_for_serving`` and wrap it in an ``Engine`` (not yet
    started). ``engine_kwargs`` go to ``Engine`` (``overlap``, ``enable_prefix_caching``, ...).

    Example:
        >>> import torch
        >>> from opforge.models.testing import write_tiny_checkpoint
        >>> engine = build_engine(write_tiny_checkpoint(), device="cpu", dtype=torch.float32, max_model_len=64, kv_blocks=16)
        >>> engine.max_model_len
        64
    """
    from . import Engine
    model, tokenizer = load_for_serving(model_dir, device=device, dtype=dtype, quantize=quantize,
                                        max_model_len=max_model_len)
    return Engine(model, max_num_seqs=max_num_seqs, block_size=block_size, kv_memory_fraction=kv_memory_fraction,
                  kv_blocks=kv_blocks, tokenizer=tokenizer, **engine_kwargs)


def kernel_backends(engine: Any) -> str:
    """Run one short request through a started engine under ``opforge.trace()`` and name the
    backends its kernels ran on (this also compiles them before the first client comes)."""
    import opforge
    from . import SamplingParams
    with opforge.trace() as t:
        for _ in engine.add_request("warmup", [1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True)):
            pass
    seen = Counter(e.backend for e in t)
    return ", ".join(f"{b} ({n} calls)" for b, n in seen.most_common()) or "none traced"


def _server_class() -> type:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, but a handled SIGTERM/SIGINT ends in a normal return (exit 0), and
        readiness is announced once the socket is bound."""

        ready_message = ""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started and self.ready_message:
                print(self.ready_message, flush=True)

    return Server


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``opforge serve``; returns the exit status (0 after a SIGTERM drain).

    Example:
        >>> from opforge.serve.cli import main
        >>> main(["/no/such/dir"])   # doctest: +SKIP
    """
    p = argparse.ArgumentParser(prog="opforge serve", description=__doc__.splitlines()[0])
    p.add_argument("model_dir", help="a checkpoint directory (Hugging Face layout) or a model file (GGUF)")
    p.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1 (loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", help="cuda, cuda:N, mps or cpu (default: the best available)")
    p.add_argument("--dtype", choices=sorted(_DTYPES), help="default: the device's (bf16 on CUDA, float32 on CPU)")
    p.add_argument("--quantize", choices=["stored", "dense", "int8", "int4"],
                   help="int8/int4: quantize the projections; dense: dequantize a GGUF file's quantized weights; "
                        "stored: as the checkpoint stores them (default: stored, except a GGUF file on the CPU: "
                        "dense, since the CPU's torch path would dequantize quantized weights at every step)")
    p.add_argument("--max-num-seqs", type=int, default=256, help="requests decoded at once")
    p.add_argument("--max-model-len", type=int, help="prompt + output tokens per request (default: the "
                                                     "checkpoint's context, at most 8192)")
    p.add_argument("--kv-memory-fraction", type=float, default=0.9,
                   help="fraction of free device memory for the KV cache")
    p.add_argument("--kv-blocks", type=int, help="an explicit KV block count instead of --kv-memory-fraction")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default 16)")
    p.add_argument("--max-num-batched-tokens", type=int, help="tokens per engine step at most (decode + prefill)")
    p.add_argument("--max-prefill-tokens-while-decoding", type=int,
                   help=f"prompt tokens at most in a step that also decodes, so a new prompt delays running "
                        f"streams by a short step (default {SERVER_PREFILL_WHILE_DECODING}; 0: no bound beyond "
                        f"--max-num-batched-tokens, more tokens/s, longer stalls; see docs/server.md)")
    p.add_argument("--no-prefix-caching", action="store_true", help="do not share equal prompt prefixes' blocks")
    p.add_argument("--no-overlap", action="store_true",
                   help="read each greedy decode step's tokens before launching the next (default: the next step "
                        "is launched first, overlapping the host's work with the GPU's)")
    p.add_argument("--served-model-name", help="the name clients use (default: the directory's name)")
    p.add_argument("--api-key", default=os.environ.get("OPFORGE_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 (default: $OPFORGE_API_KEY)")
    p.add_argument("--max-waiting", type=int, help="requests allowed to wait; beyond, 429 (default: no limit)")
    p.add_argument("--max-body-bytes", type=int, default=4 << 20)
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="seconds running requests get to finish after SIGTERM (default 30)")
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    args = p.parse_args(argv)
    for name in ("max_num_seqs", "max_model_len", "kv_blocks", "block_size", "max_body_bytes", "max_num_batched_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.max_prefill_tokens_while_decoding is not None and args.max_prefill_tokens_while_decoding < 0:
        p.error(f"--max-prefill-tokens-while-decoding must be >= 0 (0: no bound), got "
                f"{args.max_prefill_tokens_while_decoding}")
    if args.max_waiting is not None and args.max_waiting < 0:
        p.error(f"--max-waiting must be >= 0, got {args.max_waiting}")
    if not 0.0 < args.kv_memory_fraction <= 1.0:
        p.error(f"--kv-memory-fraction must be in (0, 1], got {args.kv_memory_fraction}")
    if not (os.path.isfile(args.model_dir) or os.path.exists(os.path.join(args.model_dir, "config.json"))):
        p.error(f"{args.model_dir!r} is neither a checkpoint directory (with config.json) nor a model file")

    import uvicorn
    from .api import ServerConfig, create_app
    from .chat_template import chat_template_for
    from ..api import device_config
    from ..models.loader import default_quantize
    quantize = default_quantize(args.model_dir, device_config(args.device).device) if args.quantize is None else \
        None if args.quantize == "stored" else args.quantize
    engine = build_engine(args.model_dir, device=args.device, dtype=_DTYPES.get(args.dtype), quantize=quantize,
                          max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                          kv_memory_fraction=args.kv_memory_fraction, kv_blocks=args.kv_blocks,
                          block_size=args.block_size, max_num_batched_tokens=args.max_num_batched_tokens,
                          max_prefill_tokens_while_decoding=prefill_bound(args.max_prefill_tokens_while_decoding),
                          enable_prefix_caching=not args.no_prefix_caching, overlap=not args.no_overlap)
    name = args.served_model_name or os.path.basename(os.path.normpath(args.model_dir))
    if os.path.isfile(args.model_dir) and not args.served_model_name:
        name = os.path.splitext(name)[0]          # model.gguf -> model
    template = chat_template_for(args.model_dir, engine.model, engine.tokenizer)
    config = ServerConfig(model_name=name, chat_template=template, api_key=args.api_key,
                          max_waiting=args.max_waiting, max_body_bytes=args.max_body_bytes)
    engine.warm_up()
    engine.start()
    try:
        backends = kernel_backends(engine)
        s = engine.stats()
        app = create_app(engine, config, manage_engine=False)
        server = _server_class()(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                                timeout_graceful_shutdown=max(1, round(args.drain_timeout))))
        server.ready_message = (f"opforge serve: http://{args.host}:{server.config.port}/v1  model {name!r}  "
                                f"kernels: {backends}  KV cache: {s.blocks_total} blocks of {args.block_size} tokens "
                                f"= {s.blocks_total * args.block_size} tokens (max model len {engine.max_model_len}, "
                                f"max {args.max_num_seqs} sequences)"
                                f"{'  API key required' if args.api_key else ''}")
        server.run()
    finally:
        engine.shutdown()
    return 0 if server.started else 1
