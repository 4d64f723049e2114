"""Prometheus metrics of the server: requests by outcome, tokens, latencies, and the engine's state.

Counters and histograms are updated by the HTTP side as requests finish; the engine's gauges
(running and waiting requests, KV blocks, prefix-cache queries and hits; GPU memory allocated on
CUDA) are read from ``engine.stats()`` when ``/metrics`` is scraped, so the step loop does no
metrics work. The process's own memory and CPU time come from prometheus_client (``process_*``).
"""
from __future__ import annotations

from typing import Any, Iterator

import torch
from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

#: Outcomes a request is counted under.
OUTCOMES = ("stop", "length", "abort", "client_error", "unauthorized", "rejected")
#: Endpoints requests are counted under.
ENDPOINTS = ("completion", "chat", "models")

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)
_E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)


class _EngineCollector:
    """Reads the engine's state at scrape time."""

    def __init__(self, engine: Any):
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        s = self.engine.stats()
        gauges = (("opforge_requests_running", "requests being decoded or prefilled", s.running),
                  ("opforge_requests_waiting", "requests waiting to be admitted", s.waiting),
                  ("opforge_kv_blocks_total", "KV cache blocks in the pool", s.blocks_total),
                  ("opforge_kv_blocks_used", "KV cache blocks held by requests", s.blocks_used),
                  ("opforge_kv_blocks_free", "KV cache blocks free (cached ones included)", s.blocks_free),
                  ("opforge_kv_blocks_cached", "free KV cache blocks still holding a reusable prefix", s.blocks_cached),
                  ("opforge_engine_step_seconds", "duration of the engine's last step", s.step_time_s))
        for name, doc, value in gauges:
            yield GaugeMetricFamily(name, doc, value=value)
        device = getattr(self.engine, "device", None)
        if isinstance(device, torch.device) and device.type == "cuda":
            yield GaugeMetricFamily("opforge_device_memory_allocated_bytes", "tensor memory allocated on the GPU",
                                    value=torch.cuda.memory_allocated(device))
        for name, doc, value in (("opforge_prefix_cache_queries", "prompt blocks looked up in the prefix cache",
                                  s.prefix_cache_queries),
                                 ("opforge_prefix_cache_hits", "prompt blocks found in the prefix cache",
                                  s.prefix_cache_hits),
                                 ("opforge_engine_steps", "engine steps run", s.steps)):
            yield CounterMetricFamily(name, doc, value=value)


class ServerMetrics:
    """The server's metrics in their own registry (several servers may live in one process).

    Example:
        >>> from types import SimpleNamespace
        >>> stats = SimpleNamespace(running=1, waiting=0, blocks_total=8, blocks_used=2, blocks_free=6,
        ...                         blocks_cached=1, prefix_cache_queries=4, prefix_cache_hits=3, step_time_s=0.01, steps=9)
        >>> m = ServerMetrics(SimpleNamespace(stats=lambda: stats))
        >>> m.finished("chat", "stop", prompt_tokens=5, completion_tokens=3)
        >>> text = m.render().decode()
        >>> 'opforge_requests_total{endpoint="chat",outcome="stop"} 1.0' in text, "opforge_kv_blocks_used 2.0" in text
        (True, True)
    """

    def __init__(self, engine: Any):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("opforge_requests", "requests answered, by endpoint and outcome",
                                ["endpoint", "outcome"], registry=r)
        for endpoint in ENDPOINTS:          # every series exists from the start, at 0
            for outcome in OUTCOMES:
                self.requests.labels(endpoint, outcome)
        self.prompt_tokens = Counter("opforge_prompt_tokens", "prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter("opforge_generation_tokens", "tokens generated", registry=r)
        self.ttft = Histogram("opforge_time_to_first_token_seconds", "from the request's arrival to its first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("opforge_inter_token_latency_seconds", "between consecutive tokens of one request",
                             buckets=_ITL_BUCKETS, registry=r)
        self.e2e = Histogram("opforge_request_latency_seconds", "from the request's arrival to its last token",
                             buckets=_E2E_BUCKETS, registry=r)
        r.register(_EngineCollector(engine))
        ProcessCollector(registry=r)        # process_resident_memory_bytes, CPU seconds, open files (Linux)

    def finished(self, endpoint: str, outcome: str, prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
        """Count one request under ``outcome`` (one of ``OUTCOMES``) with its token counts."""
        self.requests.labels(endpoint, outcome).inc()
        if prompt_tokens:
            self.prompt_tokens.inc(prompt_tokens)
        if completion_tokens:
            self.generation_tokens.inc(completion_tokens)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
