"""The OpenAI API's request and response bodies (the parts opforge serves), as pydantic models.

Requests are validated strictly (a string where a number belongs is an error, not a conversion);
fields this server does not implement are refused by name when a client sets them to anything
but their neutral value (see ``unsupported``), and unknown fields are ignored. The sampling
extensions of other local servers are accepted: ``top_k``, ``min_tokens``, ``ignore_eos``,
``stop_token_ids``.
"""
from __future__ import annotations

import json
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Request):
    include_usage: bool = False


class _Sampling(_Request):
    """The fields completions and chat share."""

    model: str
    temperature: Optional[float] = Field(None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(None, ge=-1)
    seed: Optional[int] = Field(None, ge=0, le=2**63 - 1)
    stop: Optional[Union[str, list[str]]] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    n: int = Field(1, ge=1)
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    repetition_penalty: Optional[float] = None
    logit_bias: Optional[dict[str, Any]] = None
    user: Optional[str] = None
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    stop_token_ids: Optional[list[int]] = None

    def unsupported(self) -> Optional[tuple[str, str]]:
        """(field, why) for the first field set to something this server does not implement."""
        if self.n != 1:
            return "n", "only n=1 is supported"
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0.0):
                return name, f"{name} is not supported (only 0)"
        if self.repetition_penalty not in (None, 1.0):
            return "repetition_penalty", "repetition_penalty is not supported (only 1)"
        if self.logit_bias:
            return "logit_bias", "logit_bias is not supported"
        return None


class CompletionRequest(_Sampling):
    """``POST /v1/completions``: one prompt, as text or token ids (or a list holding one of them).

    Example:
        >>> CompletionRequest.model_validate({"model": "m", "prompt": [1, 2, 3], "max_tokens": 4}).prompt
        [1, 2, 3]
    """

    prompt: Union[str, list[int], list[str], list[list[int]]]
    max_tokens: Optional[int] = Field(16, ge=1)
    echo: bool = False
    logprobs: Optional[int] = None
    best_of: Optional[int] = None
    suffix: Optional[str] = None

    def unsupported(self) -> Optional[tuple[str, str]]:
        if self.echo:
            return "echo", "echo is not supported"
        if self.logprobs is not None:
            return "logprobs", "logprobs are not supported"
        if self.best_of not in (None, 1):
            return "best_of", "only best_of=1 is supported"
        if self.suffix:
            return "suffix", "suffix is not supported"
        return super().unsupported()


class TextPart(_Request):
    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[str, list[TextPart]]] = None
    name: Optional[str] = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``.

    Example:
        >>> r = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        >>> r.messages[0].text(), r.token_limit()
        ('hi', None)
    """

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Optional[int] = Field(None, ge=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None
    response_format: Optional[dict[str, Any]] = None
    add_generation_prompt: bool = True

    def token_limit(self) -> Optional[int]:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def unsupported(self) -> Optional[tuple[str, str]]:
        if self.logprobs or self.top_logprobs:
            return "logprobs", "logprobs are not supported"
        if self.tools or self.tool_choice not in (None, "none"):
            return "tools", "tool calls are not supported"
        if self.response_format and self.response_format.get("type") != "text":
            return "response_format", "only response_format {'type': 'text'} is supported"
        return super().unsupported()


# ---- responses ------------------------------------------------------------------------------------
class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: Optional[str]


class Completion(BaseModel):
    """A completion, or one chunk of a streamed one (``usage`` only on the last chunk, when asked)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Optional[Usage] = None
    system_fingerprint: Optional[str] = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: None = None
    finish_reason: Optional[str]


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: Optional[str] = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "opforge"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[str] = None


class ErrorResponse(BaseModel):
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``.

    Example:
        >>> ErrorResponse(error=ErrorDetail(message="bad", type="invalid_request_error")).model_dump()["error"]["code"] is None
        True
    """

    error: ErrorDetail


def chat_chunk(id: str, created: int, model: str, *, role: Optional[str] = None, content: Optional[str] = None,
               finish_reason: Optional[str] = None, usage: Optional[Usage] = None,
               with_choice: bool = True) -> dict[str, Any]:
    """One ``chat.completion.chunk`` of a stream: a delta (role and/or content) and maybe the finish
    reason; ``with_choice=False`` gives the closing usage chunk (no choices).

    Example:
        >>> chat_chunk("c1", 0, "m", role="assistant", content="")["choices"][0]["delta"]
        {'role': 'assistant', 'content': ''}
    """
    delta: dict[str, str] = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}] if with_choice else []
    return {"id": id, "object": "chat.completion.chunk", "created": created, "model": model, "choices": choices,
            "usage": usage.model_dump() if usage is not None else None, "system_fingerprint": None}


class StreamChunks:
    """The server-sent events of one streamed answer, from JSON templates made once per request
    (a token's event costs one string escape, not a model build and dump).

    Example:
        >>> import json
        >>> c = StreamChunks("chat", "c1", 0, "m")
        >>> json.loads(c.delta("hi", None)[len("data: "):]) == chat_chunk("c1", 0, "m", content="hi")
        True
        >>> d = json.loads(StreamChunks("completion", "c2", 0, "m").delta("x", "length")[len("data: "):])
        >>> d == json.loads(Completion(id="c2", created=0, model="m",
        ...                            choices=[CompletionChoice(text="x", finish_reason="length")]).model_dump_json())
        True
    """

    def __init__(self, kind: str, id: str, created: int, model: str):
        self.kind, self.id, self.created, self.model = kind, id, created, model
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        head = json.dumps({"id": id, "object": obj, "created": created, "model": model}, ensure_ascii=False)[:-1]
        if kind == "chat":
            self._pre = head + ',"choices":[{"index":0,"delta":{"content":'
            self._mid = '},"logprobs":null,"finish_reason":'
        else:
            self._pre = head + ',"choices":[{"index":0,"text":'
            self._mid = ',"logprobs":null,"finish_reason":'
        self._post = '}],"usage":null,"system_fingerprint":null}\n\n'

    def delta(self, text: str, finish_reason: Optional[str]) -> str:
        """The event for new text (and the finish reason on the last one)."""
        reason = "null" if finish_reason is None else json.dumps(finish_reason)
        return f"data: {self._pre}{json.dumps(text, ensure_ascii=False)}{self._mid}{reason}{self._post}"

    def role(self) -> str:
        """A chat stream's first event: the role ``"assistant"`` and empty content."""
        return _event(chat_chunk(self.id, self.created, self.model, role="assistant", content=""))

    def usage(self, usage: Usage) -> str:
        """The closing event with the token counts (no choices)."""
        if self.kind == "chat":
            return _event(chat_chunk(self.id, self.created, self.model, usage=usage, with_choice=False))
        chunk = Completion(id=self.id, created=self.created, model=self.model, choices=[], usage=usage)
        return f"data: {chunk.model_dump_json()}\n\n"


def _event(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"
