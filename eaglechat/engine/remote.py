"""RemoteEngine: the Engine protocol over an OpenAI-compatible server (eaglechat serve, vLLM, SGLang, ...).

Text streams as chat.completion.chunk events; cancel closes the stream (the server then stops
decoding). The client measures time to first token and tokens/s itself; what the server reports about
speculation is read by engine/remote_metrics.py, by server kind (`owned_by` in GET /v1/models).
eaglechat's own server sends each engine step as one chunk (token ids, drafted flags, per-token texts,
step stats), so a RemoteEngine in front of it passes the same contract tests as the LocalEngine.
"""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Iterator
from urllib.parse import urlsplit

import httpx

from eaglechat.engine.protocol import (
    EngineInfo,
    Event,
    Finished,
    GenerationParams,
    GenerationStats,
    Speculate,
    StepStats,
    StopReason,
    TextDelta,
    TreeBudget,
)
from eaglechat.engine.remote_metrics import Metrics, parse_prometheus, read_speculation
from eaglechat.errors import ContextTooLong, ModelNotFound, RemoteError, UsageError

KINDS = ("eaglechat", "vllm", "sglang")


def base_url(url: str) -> str:
    """'host:8000', 'http://host:8000' or 'http://host:8000/v1/' -> 'http://host:8000/v1'."""
    url = url.strip().rstrip("/")
    if not re.match(r"^https?://", url):
        url = f"http://{url}"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- urlsplit checks the port only when asked
    except ValueError as exc:  # "Invalid IPv6 URL", "Port out of range 0-65535"
        raise UsageError(f"--remote {url!r} is not a valid URL ({exc})") from None
    if not parts.hostname:
        raise UsageError(f"--remote {url!r} is not a URL (http://HOST:PORT)")
    try:
        httpx.URL(url)  # httpx's own host check (IDNA), which would otherwise fail on the first request
        parts.hostname.encode("idna")  # the resolver's: every label 1..63 characters (a UnicodeError there)
    except (httpx.InvalidURL, UnicodeError) as exc:
        raise UsageError(f"--remote {url!r} is not a valid URL ({exc})") from None
    return url if parts.path.endswith("/v1") else f"{url}/v1"


def server_root(url: str) -> str:
    return url[: -len("/v1")] if url.endswith("/v1") else url


def error_message(response: httpx.Response) -> tuple[str, str]:
    """(first line of the message, code) of an error body: OpenAI's {"error": {"message", "code"}}, or
    {"error"|"message"|"detail": str}."""
    try:
        body = json.loads(response.read() or b"{}")
    except ValueError:
        body = {}
    body = body if isinstance(body, dict) else {}
    error = body.get("error")
    message = error.get("message") if isinstance(error, dict) else error or body.get("message") or body.get("detail")
    code = error.get("code") if isinstance(error, dict) else body.get("code")
    message = str(message or response.reason_phrase or "").strip()
    return (message.splitlines()[0] if message else ""), str(code or "")


def speculate_default(value) -> Speculate:
    """An eaglechat server's `speculate_by_default`: true, false or "auto"; anything else reads as on."""
    try:
        return Speculate.of(value)
    except ValueError:
        return Speculate.ON


class RemoteEngine:
    def __init__(self, url: str, *, model: str | None = None, api_key: str | None = None, stream: bool = True,
                 timeout: float = 600.0, transport: httpx.BaseTransport | None = None, progress=None):
        self.url = base_url(url)
        self.stream = stream
        # as UTF-8 bytes: httpx encodes a str header as ASCII, and a non-ASCII key was a UnicodeEncodeError
        headers = {"Authorization": f"Bearer {api_key}".encode("utf-8", "surrogateescape")} if api_key else {}
        self.client = httpx.Client(headers=headers, transport=transport,
                                   timeout=httpx.Timeout(timeout, connect=10.0))
        if progress:
            progress(f"connecting to {self.url}", None)
        self.models = self.list_models()
        if not self.models:
            raise RemoteError(f"{self.url} serves no models")
        self.use(model)

    @property
    def model_ids(self) -> list[str]:
        return [str(m["id"]) for m in self.models]

    def use(self, model: str | None) -> None:
        """Talk to `model` (None: the server's first); its card says what kind of server this is."""
        if model is None:
            card = self.models[0]
        elif model in self.model_ids:
            card = self.models[self.model_ids.index(model)]
        else:
            raise ModelNotFound(f"{self.url} has no model {model!r} (it serves: {', '.join(self.model_ids)})")
        owner = str(card.get("owned_by", "")).lower()
        self.kind = owner if owner in KINDS else "openai"
        own = card.get("eaglechat") if isinstance(card.get("eaglechat"), dict) else {}
        tree = own.get("tree") or {}
        self.info = EngineInfo(
            model=str(card["id"]), device="remote", dtype=own.get("dtype", ""), quant=own.get("quant", ""),
            tree=TreeBudget.from_dict(tree) if tree else TreeBudget(total_tokens=0, depth=0, draft_top_k=0, kind="remote"),
            max_context=int(card.get("max_model_len") or card.get("context_length") or 2048),
            head=own.get("head", ""), speculate_by_default=speculate_default(own.get("speculate_by_default", True)),
            server=self.kind, endpoint=self.url,
        )
        # an eaglechat server's model's own sampling, so a client fills what the user left out as a local
        # load of the same model would (eaglechat/models/sampling.py)
        # an eaglechat server says whether the model's template has the thinking switch (vLLM and SGLang
        # do not say: their switch is sent only when asked for, see thinking_fields)
        thinking = own.get("thinking") if isinstance(own.get("thinking"), dict) else {}
        self.info.thinking_switch = thinking.get("switch") is True
        self.reasoning_opened = thinking.get("opens") is True  # its prompt opens <think>: replies carry only the close
        sampling = own.get("sampling")
        if isinstance(sampling, dict) and sampling:
            self.info.sampling = {k: v for k, v in sampling.items() if isinstance(v, (int, float))}
            self.info.sampling_source = f"the server's ({self.url})"

    # -- HTTP with one-line errors ---------------------------------------------------------------
    def _fail(self, response: httpx.Response, what: str) -> Exception:
        message, code = error_message(response)
        status = response.status_code
        if status in (401, 403):
            return RemoteError(f"{self.url} refused the API key (HTTP {status}): pass --api-key KEY or set "
                               "EAGLECHAT_API_KEY")
        if status == 404:
            if what == "models":
                return RemoteError(f"{self.url} is not an OpenAI-compatible server (GET /v1/models: HTTP 404)")
            return ModelNotFound(f"{self.url}: {message or 'model not found'} (HTTP 404)")
        if status in (429, 503):
            retry = response.headers.get("retry-after")
            return RemoteError(f"{self.url} is busy (HTTP {status}{f', retry in {retry} s' if retry else ''})"
                               f"{': ' + message if message else ''}")
        if status == 400 and ("context_length_exceeded" in str(code) or "maximum context length" in message):
            return ContextTooLong(f"{self.url}: {message}")
        if 400 <= status < 500:
            return UsageError(f"{self.url} refused the request (HTTP {status}): {message}")
        return RemoteError(f"{self.url} failed (HTTP {status}){': ' + message if message else ''}")

    def _unreachable(self, exc: Exception) -> RemoteError:
        reason = str(exc).strip() or type(exc).__name__
        return RemoteError(f"cannot reach {self.url}: {reason}")

    def list_models(self) -> list[dict]:
        try:
            r = self.client.get(f"{self.url}/models")
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        if r.status_code != 200:
            raise self._fail(r, "models")
        try:
            data = r.json().get("data")
        except (ValueError, AttributeError):
            data = None
        if not isinstance(data, list):
            raise RemoteError(f"{self.url} is not an OpenAI-compatible server (GET /v1/models gave no model list)")
        return [m for m in data if isinstance(m, dict) and m.get("id")]

    def server_metrics(self) -> Metrics:
        """The server's Prometheus counters and gauges ({} when it has no /metrics)."""
        try:
            r = self.client.get(f"{server_root(self.url)}/metrics", timeout=5.0)
        except httpx.HTTPError:
            return {}
        return parse_prometheus(r.text) if r.status_code == 200 else {}

    # -- the protocol -----------------------------------------------------------------------------
    def request_body(self, messages: list[dict], params: GenerationParams, stream: bool) -> dict:
        body = {"model": self.info.model, "messages": messages, "stream": stream,
                "max_tokens": params.max_new_tokens, "temperature": params.temperature}
        if params.top_p < 1.0:
            body["top_p"] = params.top_p
        if params.seed is not None:
            body["seed"] = params.seed
        if params.min_p > 0.0 and self.kind in KINDS:  # an extension (vLLM, SGLang, eaglechat)
            body["min_p"] = params.min_p
        if params.repetition_penalty != 1.0 and params.repeat_last_n != 0 and self.kind in KINDS:
            body["repetition_penalty"] = params.repetition_penalty
            if params.repeat_last_n != -1 and self.kind == "eaglechat":  # a window: eaglechat (and llama-server) read it
                body["repeat_last_n"] = params.repeat_last_n
        for name in ("presence_penalty", "frequency_penalty"):  # OpenAI's own parameters
            if getattr(params, name):
                body[name] = getattr(params, name)
        if stream:
            body["stream_options"] = {"include_usage": True}
        if params.top_k > 0 and self.kind in KINDS:  # an extension; api.openai.com would refuse it
            body["top_k"] = params.top_k
        if self.kind == "eaglechat":  # true, false or "auto" (the server measures both while decoding)
            body["speculate"] = params.speculate.wire
        if self.kind in ("eaglechat", "vllm"):
            body["return_token_ids"] = True
        if self.kind == "sglang" and not stream:
            body["return_meta_info"] = True
        body.update(self.thinking_fields(params.thinking))
        return body

    def thinking_fields(self, thinking: bool | str | None) -> dict:
        """The chat's thinking choice as the server reads it: on or off as chat_template_kwargs.enable_thinking
        (vLLM's and SGLang's field, which eaglechat's server reads too; api.openai.com has none), a level
        as OpenAI's reasoning_effort. None (the template's own default) sends nothing."""
        if isinstance(thinking, str):
            return {"reasoning_effort": {"max": "high"}.get(thinking, thinking)}  # Ollama's top level, OpenAI's name
        if thinking is None or self.kind not in KINDS:
            return {}
        return {"chat_template_kwargs": {"enable_thinking": bool(thinking)}}

    def count_tokens(self, messages: list[dict]) -> int:
        """Prompt tokens of these messages, from the server's /tokenize (vLLM's endpoint; eaglechat's too)."""
        try:
            r = self.client.post(f"{server_root(self.url)}/tokenize", json={"model": self.info.model, "messages": messages},
                                 timeout=30.0)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        if r.status_code != 200:
            raise self._fail(r, "tokenize")
        return int(r.json()["count"])

    def generate(self, messages: list[dict], params: GenerationParams,
                 cancel: threading.Event | None = None) -> Iterator[Event]:
        before = self.server_metrics() if self.kind == "vllm" else {}
        run = _Run(self, before)
        if cancel is not None and cancel.is_set():  # nothing asked of the server
            run.cancelled = True
            yield run.finished()
            return
        body = self.request_body(messages, params, self.stream)
        try:
            with self.client.stream("POST", f"{self.url}/chat/completions", json=body) as response:
                if response.status_code != 200:
                    raise self._fail(response, "chat")
                if self.stream:
                    yield from run.read_stream(response, cancel)
                else:
                    yield from run.read_whole(response)
        except httpx.HTTPError as exc:
            if run.cancelled:
                pass
            elif run.text_parts:
                raise RemoteError(f"{self.url} closed the stream mid-reply: {exc}") from None
            else:
                raise self._unreachable(exc) from None
        yield run.finished()

    def close(self) -> None:
        self.client.close()


class _Run:
    """One request's text, ids, timings and the speculation figures the server gave."""

    def __init__(self, engine: RemoteEngine, metrics_before: Metrics):
        self.engine = engine
        self.before = metrics_before
        self.start = time.perf_counter()
        self.first: float | None = None
        self.whole = False
        self.text_parts: list[str] = []
        self.ids: list[int] = []
        self.finish_reason = ""
        self.usage: dict = {}
        self.metrics: dict = {}
        self.meta: dict = {}
        self.steps: list[StepStats] = []  # eaglechat's per-step stats, as they streamed by
        self.cancelled = False
        self.reasoning_open = False  # a <think> block was opened for the server's reasoning field

    def _text(self, part: dict) -> str:
        """A delta's (or a whole message's) text. A server that parses the reasoning out (vLLM's and SGLang's
        reasoning parsers: `reasoning_content`, or vLLM's newer `reasoning`) sends it apart; it comes back
        here as a <think> block before the answer, which the chat folds as it folds a model's own
        (eaglechat's server, asked for token ids, sends the text as the ids spell it)."""
        reasoning = part.get("reasoning_content") or part.get("reasoning") or ""
        content = part.get("content") or ""
        text = ""
        if isinstance(reasoning, str) and reasoning:
            text = ("" if self.reasoning_open else "<think>") + reasoning
            self.reasoning_open = True
        if content and self.reasoning_open:
            text, self.reasoning_open = text + "</think>", False
        return text + content

    def _delta(self, text: str, choice: dict) -> TextDelta | None:
        """One chunk's text -> a TextDelta. eaglechat's server sends each engine step as one chunk with
        its step stats and per-token texts; from other servers a delta carries no step."""
        ids = [int(i) for i in choice.get("token_ids") or []]
        own = choice.get("eaglechat") if isinstance(choice.get("eaglechat"), dict) else None
        if not text and not ids and own is None:
            return None
        if self.first is None and text:
            self.first = time.perf_counter()
        self.text_parts.append(text)
        self.ids += ids
        drafted = choice.get("drafted")
        drafted = [bool(d) for d in drafted] if isinstance(drafted, list) and len(drafted) == len(ids) else [False] * len(ids)
        texts = (own or {}).get("token_texts")
        if not (isinstance(texts, list) and len(texts) == len(ids) and "".join(texts) == text):
            texts = [text] + [""] * (len(ids) - 1) if ids else []  # the chunk's text, on its first token
        step = (own or {}).get("step")
        step = StepStats.from_dict(step) if isinstance(step, dict) else None
        if step is not None:
            self.steps.append(step)
        return TextDelta(text, ids, drafted, step, texts)

    def read_stream(self, response: httpx.Response, cancel: threading.Event | None) -> Iterator[TextDelta]:
        for line in response.iter_lines():
            if cancel is not None and cancel.is_set():
                self.cancelled = True  # leaving the `with` closes the connection: the server stops
                return
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            try:
                chunk = json.loads(data)
            except ValueError:
                raise RemoteError(f"{self.engine.url} sent a malformed stream event: {data[:80]!r}") from None
            if chunk.get("error"):
                error = chunk["error"]
                message = error.get("message") if isinstance(error, dict) else str(error)
                if isinstance(error, dict) and error.get("code") == "context_length_exceeded":
                    raise ContextTooLong(f"{self.engine.url}: {message}")
                raise RemoteError(f"{self.engine.url} failed mid-reply: {message}")
            if chunk.get("usage"):
                self.usage = chunk["usage"]
            if isinstance(chunk.get("metrics"), dict):
                self.metrics = chunk["metrics"]
            for choice in chunk.get("choices") or []:
                delta = self._delta(self._text(choice.get("delta") or {}), choice)
                if delta is not None:
                    yield delta
                if choice.get("finish_reason"):
                    self.finish_reason = choice["finish_reason"]
        if cancel is not None and cancel.is_set():
            self.cancelled = True

    def read_whole(self, response: httpx.Response) -> Iterator[TextDelta]:
        body = json.loads(response.read())
        choice = (body.get("choices") or [{}])[0]
        self.usage = body.get("usage") or {}
        self.metrics = body.get("metrics") if isinstance(body.get("metrics"), dict) else {}
        self.meta = choice.get("meta_info") or body.get("meta_info") or {}
        self.finish_reason = choice.get("finish_reason") or ""
        self.whole = True
        delta = self._delta(self._text(choice.get("message") or {}), choice)
        if delta is not None:
            yield delta

    def finished(self) -> Finished:
        end = time.perf_counter()
        text = "".join(self.text_parts)
        new = len(self.ids) if self.cancelled else int(self.usage.get("completion_tokens") or len(self.ids))
        elapsed = end - self.start
        stats = GenerationStats(new_tokens=new, elapsed_s=elapsed, prefill_tokens=int(self.usage.get("prompt_tokens") or 0),
                                tokens_per_s=new / elapsed if elapsed > 0 else 0.0, speculate=False)
        # a whole (non-streamed) reply arrives at once: its first text is its last, so neither the time to the
        # first token nor a decode rate is measured here (0: not measured), rather than a rate over ~0 s
        if self.first is not None and not self.whole:
            stats.ttft_s = stats.prefill_s = self.first - self.start
            decode_s = end - self.first
            stats.decode_tokens_per_s = (new - 1) / decode_s if new > 1 and decode_s > 0 else 0.0
        if self.cancelled:  # no usage chunk came: what the steps seen so far say
            stats.target_forwards = len(self.steps)
            stats.decode_tokens = sum(step.decode_tokens for step in self.steps)
            stats.mean_accepted = stats.decode_tokens / len(self.steps) if self.steps else 0.0
            stats.speculate = any(step.tree_size > 1 for step in self.steps)
        else:
            read_speculation(stats, self.engine.kind, metrics=self.metrics, meta=self.meta, before=self.before,
                             scrape=self.engine.server_metrics)
        reason = StopReason.CANCELLED if self.cancelled else \
            StopReason.LENGTH if self.finish_reason == "length" else StopReason.STOP
        return Finished(text, self.ids, stats, reason)
