"""The OpenAI chat-completions request, checked: one `ChatRequest` or an `ApiError` that names the
parameter, with the error body the OpenAI API uses (`{"error": {"message", "type", "param", "code"}}`).

Parameters that common clients send and that change nothing here (user, n=1, penalties 0, tools=[])
are accepted; parameters that would change the output in ways this engine cannot honour (tools, n>1,
logprobs, logit_bias, JSON mode) are refused rather than silently ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from numbers import Real

from eaglechat.engine.protocol import GenerationParams

ROLES = ("system", "user", "assistant", "developer")
MAX_STOPS = 4  # as the OpenAI API


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass
class ChatRequest:
    model: str
    messages: list[dict]
    params: GenerationParams
    stream: bool = False
    include_usage: bool = False
    stops: list[str] = field(default_factory=list)
    return_token_ids: bool = False  # vLLM's extension: each choice carries the token ids of its text
    prompt: str | None = None  # a raw text prompt (completions) instead of messages
    suffix: str | None = None  # fill-in-the-middle: the text after the gap


def bad(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def unsupported(param: str, why: str) -> ApiError:
    return ApiError(400, f"'{param}' is not supported by this server: {why}", param=param, code="unsupported_parameter")


def _no_constants(name: str):
    raise ValueError(f"{name} is not a JSON number")


def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw, parse_constant=_no_constants)  # Python's json would accept NaN, Infinity
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ApiError(400, f"the request body is not valid JSON ({exc})", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    check_unicode(body)
    return body


def _printable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def check_unicode(body) -> None:
    """JSON's \\uXXXX escapes can spell a lone surrogate ("\\ud800"), which no tokenizer can encode:
    refuse it here, naming where it is."""
    stack = [(body, "")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, dict):
            for k, v in value.items():
                name = _printable(k)
                if name != k:  # the key itself is the bad string
                    raise bad(where or "body", f"a key in '{where or 'body'}' holds a lone UTF-16 surrogate "
                              "(not valid Unicode)", code="invalid_unicode")
                stack.append((v, f"{where}.{k}" if where else k))
        elif isinstance(value, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(value))
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise bad(where or "body", f"'{where or 'body'}' holds a lone UTF-16 surrogate (not valid Unicode)",
                          code="invalid_unicode") from None


def _number(body: dict, name: str, default: float, lo: float, hi: float, *, lo_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, Real):
        raise bad(name, f"'{name}' must be a number")
    if value > hi or value < lo or (lo_open and value == lo):
        interval = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise bad(name, f"'{name}' must be in {interval}, got {value}")
    return float(value)


def _integer(body: dict, name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(name, f"'{name}' must be an integer")
    return value


def _content(message: dict, i: int) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: text only
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise unsupported(f"messages[{i}].content", "only text content parts are accepted")
            texts.append(part["text"])
        return "".join(texts)
    raise bad(f"messages[{i}].content", "'content' must be a string or a list of text parts")


def chat_messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "'messages' must be a non-empty list", code="missing_required_parameter"
                  if messages is None else "invalid_value")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}]", "each message must be an object with 'role' and 'content'")
        role = m.get("role")
        if role in ("tool", "function") or m.get("tool_calls"):
            raise unsupported(f"messages[{i}].role", "tool calls are not supported")
        if role not in ROLES:
            raise bad(f"messages[{i}].role", f"'role' must be one of {', '.join(ROLES)}")
        out.append({"role": "system" if role == "developer" else role, "content": _content(m, i)})
    if not any(m["role"] == "user" and m["content"].strip() for m in out):
        raise bad("messages", "the conversation has no non-empty user message")
    return out


def _refuse_unsupported(body: dict) -> None:
    if body.get("tools") or body.get("functions"):
        raise unsupported("tools" if body.get("tools") else "functions", "tool calls are not supported")
    if body.get("tool_choice") not in (None, "none", "auto"):
        raise unsupported("tool_choice", "tool calls are not supported")
    if body.get("function_call") not in (None, "none", "auto"):
        raise unsupported("function_call", "tool calls are not supported")
    n = body.get("n")
    if n is not None and n != 1:
        raise unsupported("n", "one choice per request (n=1)")
    if body.get("logprobs"):
        raise unsupported("logprobs", "log probabilities are not returned")
    if body.get("top_logprobs"):
        raise unsupported("top_logprobs", "log probabilities are not returned")
    if body.get("logit_bias"):
        raise unsupported("logit_bias", "it would change the target distribution")
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise unsupported(name, "penalties would change the target distribution; send 0 or leave it out")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise unsupported("response_format", "only {\"type\": \"text\"}")
    if body.get("modalities") not in (None, ["text"]) or body.get("audio"):
        raise unsupported("modalities", "text only")


MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed takes 64-bit seeds


def check_model(body: dict, model: str, aliases: tuple[str, ...]) -> None:
    name = body.get("model")
    if name is not None and not isinstance(name, str):
        raise bad("model", "'model' must be a string")
    if name and name != model and name not in aliases:
        raise ApiError(404, f"the model '{name}' does not exist; this server serves '{model}'",
                       param="model", code="model_not_found")


def sampling(body: dict, *, max_tokens_limit: int, default_max_tokens: int,
             default_speculate: bool | str = True) -> GenerationParams:
    """The sampling parameters of an OpenAI request (chat or completion) -> GenerationParams.
    `speculate` (eaglechat's own field): true, false or "auto"; absent: `default_speculate`, the
    engine's `speculate_by_default`."""
    repetition = _number(body, "repetition_penalty", 1.0, 0.0, 2.0, lo_open=True)
    temperature = _number(body, "temperature", 0.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True)
    min_p = _number(body, "min_p", 0.0, 0.0, 1.0)
    top_k = _integer(body, "top_k")
    if top_k is not None and top_k < -1:
        raise bad("top_k", "'top_k' must be >= 0 (0 or -1: off)")
    seed = _integer(body, "seed")
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise bad("seed", f"'seed' must be in [0, 2^64 - 1], got {seed}")
    max_name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _integer(body, max_name)
    if max_tokens is None:
        max_tokens = default_max_tokens
    elif max_tokens < 1:
        raise bad(max_name, f"'{max_name}' must be at least 1")
    elif max_tokens > max_tokens_limit:
        raise bad(max_name, f"'{max_name}' is {max_tokens}, beyond this model's limit of {max_tokens_limit} "
                  "new tokens (the context window)", code="context_length_exceeded")
    speculate = body.get("speculate")
    if speculate is None:
        speculate = default_speculate
    elif not isinstance(speculate, bool) and speculate != "auto":
        raise bad("speculate", "'speculate' must be true, false or \"auto\"")
    return GenerationParams(temperature=temperature, top_p=top_p, top_k=max(0, top_k or 0), min_p=min_p,
                            repetition_penalty=repetition,
                            max_new_tokens=max_tokens, seed=seed, speculate=speculate)


def stop_strings(body: dict) -> list[str]:
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOPS:
        raise bad("stop", f"'stop' must be a non-empty string or a list of at most {MAX_STOPS} of them")
    return stops


def streaming(body: dict) -> tuple[bool, bool]:
    """-> (stream, include_usage)"""
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad("stream", "'stream' must be true or false")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad("stream_options", "'stream_options' must be an object")
    return stream, bool((options or {}).get("include_usage", False))


def parse_chat_request(body: dict, *, model: str, aliases: tuple[str, ...] = (), max_tokens_limit: int,
                       default_max_tokens: int, default_speculate: bool | str = True) -> ChatRequest:
    """`body` (a decoded JSON object) -> ChatRequest; raises ApiError naming the first bad parameter."""
    check_model(body, model, aliases)
    _refuse_unsupported(body)
    messages = chat_messages(body)
    params = sampling(body, max_tokens_limit=max_tokens_limit, default_max_tokens=default_max_tokens,
                      default_speculate=default_speculate)
    stops = stop_strings(body)
    stream, include_usage = streaming(body)
    return ChatRequest(model=model, messages=messages, params=params, stream=stream,
                       include_usage=include_usage, stops=stops, return_token_ids=body.get("return_token_ids") is True)


COMPLETION_MAX_TOKENS = 16  # the OpenAI completions API's default (vLLM's too)


def parse_completion_request(body: dict, *, model: str, aliases: tuple[str, ...] = (), max_tokens_limit: int,
                             default_speculate: bool | str = True) -> ChatRequest:
    """A legacy `/v1/completions` body: one text `prompt` (a string or a list of one), optional `suffix`
    (fill-in-the-middle) -> ChatRequest with `prompt` set and no messages."""
    check_model(body, model, aliases)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        raise unsupported("prompt", "one prompt per request")
    if not isinstance(prompt, str):
        raise bad("prompt", "'prompt' must be a string", code="missing_required_parameter" if prompt is None
                  else "invalid_value")
    suffix = body.get("suffix")
    if suffix is not None and not isinstance(suffix, str):
        raise bad("suffix", "'suffix' must be a string")
    if not prompt and not suffix:
        raise bad("prompt", "'prompt' is empty")
    if body.get("echo"):
        raise unsupported("echo", "the prompt is not echoed")
    if body.get("best_of") not in (None, 1):
        raise unsupported("best_of", "one choice per request (best_of=1)")
    _refuse_unsupported(body)
    params = sampling(body, max_tokens_limit=max_tokens_limit,
                      default_max_tokens=min(COMPLETION_MAX_TOKENS, max_tokens_limit), default_speculate=default_speculate)
    stream, include_usage = streaming(body)
    return ChatRequest(model=model, messages=[], params=params, stream=stream, include_usage=include_usage,
                       stops=stop_strings(body), prompt=prompt, suffix=suffix or None)
