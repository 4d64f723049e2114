"""opforge.serve: continuous batching over a paged KV cache, for servers and offline batches.

    engine = Engine(model)                      # a model from opforge.models.load
    engine.start()
    for out in engine.add_request("r1", prompt_ids, SamplingParams(max_tokens=64)):
        print(out.new_text, end="")

    llm = LLM("path/to/checkpoint")             # offline: many prompts at once
    outputs = llm.generate(prompts, SamplingParams(max_tokens=64))

    new_ids = generate(model, [prompt_ids], 64)  # token ids in, token ids out (on an engine of its own)

Example:
    >>> from opforge.models.testing import tiny_decoder
    >>> from opforge.serve import LLM, SamplingParams
    >>> out = LLM(tiny_decoder(), kv_blocks=32).generate([[1, 2, 3], [4, 5]], SamplingParams(max_tokens=4))
    >>> [len(o.token_ids) for o in out], out[0].finish_reason
    ([4, 4], 'length')
"""
from .engine import Engine, EngineStoppedError
from .generate import GenerationStats, generate, last_stats
from .llm import LLM, CompletionOutput
from .sampling import SamplingParams
from .stream import EngineStats, RequestOutput, RequestStream

__all__ = ["Engine", "EngineStoppedError", "LLM", "CompletionOutput", "SamplingParams", "RequestOutput",
           "RequestStream", "EngineStats", "generate", "GenerationStats", "last_stats"]
