"""What both faces (OpenAI's /v1, Ollama's /api) read from a request: the body as checked JSON, the
conversation, the sampling values bounded into GenerationParams, and the `ChatRequest` the worker runs.
Each face maps its own field names onto these (server/openai_schema.py, server/ollama.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from numbers import Real

from eaglechat.engine.protocol import GenerationParams, Speculate
from eaglechat.models import sampling as model_sampling
from eaglechat.server.errors import ApiError, bad, unsupported

ROLES = ("system", "user", "assistant", "developer")
MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed takes 64-bit seeds
MAX_STOPS = 32  # llama-server and Ollama take many; autocomplete clients send a dozen or more
# A repetition penalty divides the logits of tokens already seen: below this, the quotient overflows fp32
# (1e-38 made every logit inf and the reply empty) and the template's own tokens win every step; 1/100 is
# far from both and still lets a client reward repetition.
REPETITION_PENALTY = (0.01, 2.0)
OPENAI_PENALTY = (-2.0, 2.0)  # presence_penalty, frequency_penalty: OpenAI's range


@dataclass
class ChatRequest:
    model: str  # the name the reply carries: the served model's
    messages: list[dict]
    params: GenerationParams
    stream: bool = False
    include_usage: bool = False
    stops: list[str] = field(default_factory=list)
    return_token_ids: bool = False  # vLLM's extension: each choice carries the token ids of its text
    prompt: str | None = None  # a raw text prompt (completions) instead of messages
    suffix: str | None = None  # fill-in-the-middle: the text after the gap
    split_reasoning: bool = False  # a reasoning model's <think> block goes apart from the answer (server/thinking.py)
    reasoning_opened: bool = False  # the prompt ended with the opening tag: the reply starts inside the block


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


def number(body: dict, name: str, default: float, lo: float, hi: float, *, lo_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, Real):
        raise bad(name, f"'{name}' must be a number")
    if value > hi or value < lo or (lo_open and value == lo):
        interval = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise bad(name, f"'{name}' must be in {interval}, got {value}")
    return float(value)


def integer(body: dict, name: str) -> int | None:
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
    """`messages` -> [{"role", "content"}] with text content; `developer` is a system message."""
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


MAX_EMBED_INPUTS = 2048  # OpenAI's limit per request


def embedding_inputs(value, param: str = "input") -> list:
    """A text, a list of texts, a list of token ids or a list of those -> a list of texts / id lists."""
    if isinstance(value, str):
        value = [value]
    elif isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        value = [value]
    if not isinstance(value, list) or not value:
        raise bad(param, f"'{param}' must be a string or a non-empty list of strings (or of token ids)",
                  code="missing_required_parameter" if value is None else "invalid_value")
    if len(value) > MAX_EMBED_INPUTS:
        raise bad(param, f"'{param}' holds {len(value)} inputs; at most {MAX_EMBED_INPUTS} per request")
    for i, item in enumerate(value):
        ids = isinstance(item, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in item)
        if not (isinstance(item, str) or ids) or not item:
            raise bad(f"{param}[{i}]", f"'{param}[{i}]' must be a non-empty string or list of token ids")
    return value


def check_model(name, model: str, aliases: tuple[str, ...], *, strict: bool = False) -> None:
    """The model a request names. Any name is answered by the served model (clients send their own
    default names, and llama-server and Ollama's single-model setups answer them); `strict`: only the
    served name or an alias, 404 for any other."""
    if name is not None and not isinstance(name, str):
        raise bad("model", "'model' must be a string")
    if strict and name and name != model and name not in aliases:
        raise ApiError(404, f"the model '{name}' does not exist; this server serves '{model}'",
                       param="model", code="model_not_found")


def stop_list(stop, param: str = "stop") -> list[str]:
    """A stop string or a list of them (at most MAX_STOPS, none empty)."""
    stops = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOPS:
        raise bad(param, f"'{param}' must be a non-empty string or a list of at most {MAX_STOPS} of them")
    return stops


def sampling(body: dict, *, max_tokens_limit: int, default_max_tokens: int,
             default_speculate: Speculate = Speculate.ON, model_defaults: dict | None = None) -> GenerationParams:
    """Sampling values under eaglechat's names (temperature, top_p, top_k, min_p, repetition_penalty,
    repeat_last_n, presence_penalty, frequency_penalty, seed, max_tokens or max_completion_tokens,
    speculate) -> GenerationParams; an ApiError naming the first value out of bounds. Every bound keeps
    at least one token to sample (engine/sampling.py says how degenerate values decode). A max_tokens
    beyond the context is clamped to it: the reply ends with "length" where the context does.
    `speculate`: true, false or "auto"; absent: `default_speculate`. The sampling fields a request leaves
    out take the model's own (`model_defaults`, eaglechat/models/sampling.py); a temperature of 0 sent
    is greedy decoding, with nothing of the model's."""
    repetition = number(body, "repetition_penalty", 1.0, *REPETITION_PENALTY)
    window = integer(body, "repeat_last_n")
    if window is not None and window < -1:
        raise bad("repeat_last_n", "'repeat_last_n' must be -1 (the whole context), 0 (off) or a positive integer")
    presence = number(body, "presence_penalty", 0.0, *OPENAI_PENALTY)
    frequency = number(body, "frequency_penalty", 0.0, *OPENAI_PENALTY)
    temperature = number(body, "temperature", 0.0, 0.0, 2.0)
    top_p = number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True)
    min_p = number(body, "min_p", 0.0, 0.0, 1.0)
    top_k = integer(body, "top_k")
    if top_k is not None and top_k < -1:
        raise bad("top_k", "'top_k' must be >= 0 (0 or -1: off)")
    seed = integer(body, "seed")
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise bad("seed", f"'seed' must be in [0, 2^64 - 1], got {seed}")
    max_name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = integer(body, max_name)
    if max_tokens is None:
        max_tokens = default_max_tokens
    elif max_tokens < 1:
        raise bad(max_name, f"'{max_name}' must be at least 1")
    speculate = body.get("speculate")
    if speculate is None:
        speculate = default_speculate
    elif not isinstance(speculate, bool) and speculate != "auto":
        raise bad("speculate", "'speculate' must be true, false or \"auto\"")
    params = GenerationParams(temperature=temperature, top_p=top_p, top_k=max(0, top_k or 0), min_p=min_p,
                              repetition_penalty=repetition, repeat_last_n=-1 if window is None else window,
                              presence_penalty=presence, frequency_penalty=frequency,
                              max_new_tokens=min(max_tokens, max_tokens_limit), seed=seed, speculate=speculate)
    given = [name for name in model_sampling.FIELDS if body.get(name) is not None]
    return model_sampling.fill(params, model_defaults or {}, given)
