"""OpenAI's request formats, checked: a chat-completions or completions body -> one `ChatRequest`, or an
`ApiError` that names the parameter (rendered as the OpenAI API does: `{"error": {"message", "type",
"param", "code"}}`).

Parameters that common clients send and that change nothing here (user, n=1, tools=[]) are accepted; parameters that would change the output in ways this engine cannot honour (tools, n>1,
logprobs, logit_bias, JSON mode) are refused rather than silently ignored.
"""

from __future__ import annotations

from eaglechat.engine.protocol import Speculate
from eaglechat.server.errors import bad, unsupported
from eaglechat.server.request import ChatRequest, chat_messages, check_model, sampling, stop_list
from eaglechat.server.thinking import Thinking, openai_thinking


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
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise unsupported("response_format", "only {\"type\": \"text\"}")
    if body.get("modalities") not in (None, ["text"]) or body.get("audio"):
        raise unsupported("modalities", "text only")


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
                       default_max_tokens: int, default_speculate: Speculate = Speculate.ON,
                       strict_model: bool = False, model_defaults: dict | None = None,
                       thinking: Thinking = Thinking()) -> ChatRequest:
    """`body` (a decoded JSON object) -> ChatRequest; raises ApiError naming the first bad parameter.
    `thinking`: what the model's template can do about reasoning (`reasoning_effort`, `chat_template_kwargs`)."""
    check_model(body.get("model"), model, aliases, strict=strict_model)
    _refuse_unsupported(body)
    messages = chat_messages(body)
    params = sampling(body, max_tokens_limit=max_tokens_limit, default_max_tokens=default_max_tokens,
                      default_speculate=default_speculate, model_defaults=model_defaults)
    params.thinking = openai_thinking(body, thinking, model)
    stops = stop_list(body.get("stop"))
    stream, include_usage = streaming(body)
    return ChatRequest(model=model, messages=messages, params=params, stream=stream,
                       include_usage=include_usage, stops=stops, return_token_ids=body.get("return_token_ids") is True,
                       split_reasoning=thinking.splits)


COMPLETION_MAX_TOKENS = 16  # the OpenAI completions API's default (vLLM's too)


def parse_completion_request(body: dict, *, model: str, aliases: tuple[str, ...] = (), max_tokens_limit: int,
                             default_speculate: Speculate = Speculate.ON, strict_model: bool = False,
                             model_defaults: dict | None = None) -> ChatRequest:
    """A legacy `/v1/completions` body: one text `prompt` (a string or a list of one), optional `suffix`
    (fill-in-the-middle) -> ChatRequest with `prompt` set and no messages."""
    check_model(body.get("model"), model, aliases, strict=strict_model)
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
                      default_max_tokens=min(COMPLETION_MAX_TOKENS, max_tokens_limit), default_speculate=default_speculate,
                      model_defaults=model_defaults)
    stream, include_usage = streaming(body)
    return ChatRequest(model=model, messages=[], params=params, stream=stream, include_usage=include_usage,
                       stops=stop_list(body.get("stop")), prompt=prompt, suffix=suffix or None)
