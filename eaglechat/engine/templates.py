"""Prompt formats: a tokenizer's own chat template rendered within limits, and the fixed formats for
bases whose tokenizer has no chat template (SafeAILab/EAGLE
`eagle/evaluation/gen_ea_answer_*.py`, which build them with FastChat's conversation templates).

The official EAGLE heads were trained on these exact formats; a different one collapses acceptance.
"tokenizer" means: use the base tokenizer's own chat template (Llama-3, Qwen2, SmolLM2, ...).
"""

from __future__ import annotations

import atexit
import json
import os
import pickle
import struct
import subprocess
import sys
import threading
from pathlib import Path

from eaglechat.errors import EaglechatError, UsageError


def _turns(messages: list[dict]) -> tuple[str | None, list[dict]]:
    system = next((m["content"] for m in messages if m.get("role") == "system"), None)
    return system, [m for m in messages if m.get("role") in ("user", "assistant")]


def vicuna(messages: list[dict], default_system: str | None) -> str:
    """FastChat vicuna_v1.1: '{sys} USER: {q} ASSISTANT: {a}</s>USER: ... ASSISTANT:' (BOS by the tokenizer)."""
    system, turns = _turns(messages)
    out = (system if system is not None else default_system or "") + " "
    for m in turns:
        if m["role"] == "user":
            out += f"USER: {m['content']} "
        else:
            out += f"ASSISTANT: {m['content']}</s>"
    return out + "ASSISTANT:"


def llama2_chat(messages: list[dict], default_system: str | None) -> str:
    """'[INST] <<SYS>>\\n{sys}\\n<</SYS>>\\n\\n{q} [/INST] {a} </s><s>[INST] ... [/INST] ' (trailing space)."""
    system, turns = _turns(messages)
    system = system if system is not None else default_system
    out, first = "", True
    for m in turns:
        if m["role"] == "user":
            content = m["content"]
            if first and system:
                content = f"<<SYS>>\n{system}\n<</SYS>>\n\n{content}"
            out += ("" if first else "<s>") + f"[INST] {content} [/INST] "
            first = False
        else:
            out += f"{m['content']} </s>"
    return out


NAMED = {"vicuna": vicuna, "llama-2-chat": llama2_chat}


def encode_named(tokenizer, name: str, messages: list[dict], default_system: str | None = None) -> list[int]:
    """Prompt ids of a named format. Typed text that spells one of the tokenizer's special tokens
    (`</s>` in a Vicuna prompt) stays text: the messages' contents are then encoded apart from the
    format with split_special_tokens (only then: the pieces' boundaries may tokenize differently
    from the whole string, and the heads were trained on the whole string)."""
    text = render(name, messages, default_system)
    specials = [t for t in getattr(tokenizer, "all_special_tokens", []) if t]
    contents = [m["content"] for m in messages if isinstance(m.get("content"), str) and m["content"]]
    if not any(t in c for c in contents for t in specials):
        return tokenizer(text)["input_ids"]
    pieces, at = [], 0  # (text, is_content) in order
    for content in contents:
        start = text.find(content, at)
        if start < 0:  # a system prompt the format left out
            continue
        pieces += [(text[at:start], False), (content, True)]
        at = start + len(content)
    pieces.append((text[at:], False))
    ids = tokenizer("")["input_ids"]  # what the tokenizer puts first (BOS), as for the whole string
    for piece, is_content in pieces:
        if piece:
            ids += tokenizer(piece, add_special_tokens=False, split_special_tokens=is_content)["input_ids"]
    return ids


def render(name: str, messages: list[dict], default_system: str | None = None) -> str:
    try:
        return NAMED[name](messages, default_system)
    except KeyError:
        raise UsageError(f"unknown prompt template {name!r} (known: tokenizer, {', '.join(NAMED)})") from None


# ====================================================================== a model folder's own template
# A tokenizer's chat template is Jinja code from the model folder: it can loop for hours or build a
# 9 GB string in one C call (`'%*d' % (1500000000, 1)`, `.format`, `| indent`), which no check inside
# this process can interrupt. It renders in a worker process (engine/template_worker.py) whose
# address space is capped at RENDER_MEMORY above its start and which is killed after RENDER_SECONDS;
# its output is refused past MAX_RENDER_CHARS. Workers persist between renders (a render is a pipe
# round trip; starting one costs an interpreter and transformers' import), one per concurrent render,
# so a slow render delays only its own request. Typed text that spells a control token of the
# template (`<|im_start|>`) is encoded as text, never as that token (transformers'
# sanitize_control_tokens), so a message cannot forge a turn.

RENDER_SECONDS = 5.0
RENDER_MEMORY = 512 * 1024 * 1024
MAX_RENDER_CHARS = 16 * 1024 * 1024
WORKER_START_SECONDS = 120.0  # an interpreter and transformers' import, on a busy machine
IDLE_WORKERS = 2
# renders at once: a flood of requests against a hostile template holds at most this many workers
# (each about 70 MB, plus what its render may take up to RENDER_MEMORY); one slow render leaves three free
MAX_WORKERS = 4
_SLOTS = threading.BoundedSemaphore(MAX_WORKERS)


class TemplateLimit(UsageError):
    """A chat template that ran past the time or size limit."""


def has_thinking_switch(tokenizer) -> bool:
    """The tokenizer's chat template reads `enable_thinking` (Qwen3's switch between thinking first and
    answering at once)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates
        template = template.get("default") or ""
    return isinstance(template, str) and "enable_thinking" in template


def apply_template(tokenizer, messages: list[dict], thinking: bool | str | None = None) -> list[int]:
    """Prompt ids of `messages` through the tokenizer's own chat template, with the generation prompt
    (what transformers' apply_chat_template(add_generation_prompt=True, sanitize_control_tokens=True)
    returns, rendered in a worker); `thinking` is passed as `enable_thinking` to a template that reads
    it (None: its own default), a level ("low", "medium", "high") as `reasoning_effort` to one that reads that."""
    variables = dict(tokenizer.special_tokens_map)
    if thinking is not None and has_thinking_switch(tokenizer):
        variables["enable_thinking"] = bool(thinking)
    if isinstance(thinking, str) and "reasoning_effort" in str(tokenizer.get_chat_template()):
        variables["reasoning_effort"] = thinking  # gpt-oss's template writes it into its system message
    request = {
        "template": tokenizer.get_chat_template(),
        "messages": [{k: v for k, v in m.items() if v is not None} for m in messages],
        "variables": variables,
        "added_tokens": [(t.content, bool(t.special)) for t in tokenizer.added_tokens_decoder.values()],
        "chat_control_tokens": getattr(tokenizer, "chat_control_tokens", None),
        "sanitize": True,
    }
    try:
        out = tokenizer(render_template(request), add_special_tokens=False, sanitize_control_tokens=True)
    except NotImplementedError:  # a template that writes no special token: nothing to forge
        out = tokenizer(render_template({**request, "sanitize": False}), add_special_tokens=False)
    if hasattr(out, "keys") and "input_ids" in out:
        out = out["input_ids"]
    return [int(t) for t in out]


def render_template(request: dict) -> str:
    """A chat template rendered in a worker (the request as engine/template_worker.py reads it)."""
    with _SLOTS:
        worker = _Worker.take()
        try:
            reply = worker.render({**request, "max_chars": MAX_RENDER_CHARS, "seconds": RENDER_SECONDS})
        except BaseException:
            worker.close()
            raise
        worker.give_back()
    if "text" in reply:
        return reply["text"]
    refusal = reply.get("error")
    if refusal == "memory":
        raise TemplateLimit(f"the model's chat template tried to use more than {RENDER_MEMORY >> 20:,} MiB "
                            "of memory; refusing to render it")
    if refusal == "size":
        raise TemplateLimit(f"the model's chat template tried to build a prompt larger than "
                            f"{MAX_RENDER_CHARS:,} characters; refusing to render it")
    raise UsageError(f"the model's chat template refused the conversation: {reply.get('message', '')}")


class _Worker:
    """One render process (see the comment above)."""

    _idle: list[_Worker] = []
    _lock = threading.Lock()
    _warmed = threading.Event()  # clear while `warm` starts a worker
    _warmed.set()

    @classmethod
    def take(cls) -> _Worker:
        # a worker `warm` is starting is this render's: wait for it rather than start a second process
        cls._warmed.wait(WORKER_START_SECONDS)
        with cls._lock:
            while cls._idle:
                worker = cls._idle.pop()
                if worker.process.poll() is None and worker.memory == RENDER_MEMORY:
                    return worker
                worker.close()
        return cls()

    def __init__(self):
        self.memory = RENDER_MEMORY
        root = str(Path(__file__).resolve().parents[2])  # this eaglechat, not another install
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "eaglechat.engine.template_worker", str(RENDER_MEMORY)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        if self._read(WORKER_START_SECONDS) != {"ready": True}:
            self.close()
            raise EaglechatError("the chat template's render process did not start")

    def render(self, request: dict) -> dict:
        data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self.process.stdin.write(struct.pack(">I", len(data)) + data)
            self.process.stdin.flush()
        except OSError:
            raise EaglechatError("the chat template's render process ended unexpectedly") from None
        reply = self._read(RENDER_SECONDS)
        if reply is None:
            raise TemplateLimit(f"the model's chat template ran for more than {RENDER_SECONDS:g} s; "
                                "refusing to render it")
        return reply

    def _read(self, seconds: float) -> dict | None:
        """The worker's next answer; None when it took longer than `seconds` (the worker is then killed)."""
        timed_out = threading.Event()

        def stop():
            timed_out.set()
            self.process.kill()

        timer = threading.Timer(seconds, stop)
        timer.start()
        try:
            line = self.process.stdout.readline()
        finally:
            timer.cancel()
        if not line.endswith(b"\n"):
            self.process.wait()
            if timed_out.is_set():
                return None
            raise EaglechatError("the model's chat template crashed its render process")
        return json.loads(line.decode("utf-8", "surrogatepass"))

    def give_back(self) -> None:
        with self._lock:
            if len(self._idle) < IDLE_WORKERS:
                self._idle.append(self)
                return
        self.close()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            try:
                pipe.close()
            except OSError:
                pass


def warm() -> None:
    """Start a render process in the background when none waits, so the first turn does not pay for it."""
    def start():
        try:
            _Worker().give_back()
        except EaglechatError:
            pass  # the first render says so
        finally:
            _Worker._warmed.set()

    with _Worker._lock:
        if _Worker._idle or not _Worker._warmed.is_set():
            return
        _Worker._warmed.clear()
    threading.Thread(target=start, daemon=True, name="eaglechat-template-warm").start()


def close_workers() -> None:
    """End the idle render processes (at exit; tests that change the limits)."""
    with _Worker._lock:
        idle, _Worker._idle = _Worker._idle, []
    for worker in idle:
        worker.close()


atexit.register(close_workers)
