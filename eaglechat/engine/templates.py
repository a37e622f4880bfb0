"""Prompt formats: a tokenizer's own chat template rendered within limits, and the fixed formats for
bases whose tokenizer has no chat template (SafeAILab/EAGLE
`eagle/evaluation/gen_ea_answer_*.py`, which build them with FastChat's conversation templates).

The official EAGLE heads were trained on these exact formats; a different one collapses acceptance.
"tokenizer" means: use the base tokenizer's own chat template (Llama-3, Qwen2, SmolLM2, ...).
"""

from __future__ import annotations

import sys
import threading
import time
from functools import lru_cache, wraps

from eaglechat.errors import UsageError


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
# A tokenizer's chat template is Jinja code from the model folder. transformers renders it in Jinja's
# ImmutableSandboxedEnvironment, which stops attribute escapes but neither time nor memory: a
# template can loop for hours or build a 9 GB string in one `'x' * 3000000000`. `apply_template`
# renders it with limits around it:
#   time    a trace function on the template's own frames (Jinja compiles templates to Python code
#           named "<template>") ends the render after RENDER_SECONDS
#   size    `*`, `**` and `+` are intercepted (Jinja's intercepted_binops) and refused before a result
#           larger than MAX_RENDER_CHARS is built; so are calls with a size argument that large
#           (`'x'.ljust(n)`); the output is counted as it streams out of the template
# and typed text that spells a control token of the template (`<|im_start|>`) is encoded as text,
# never as that token (transformers' sanitize_control_tokens), so a message cannot forge a turn.

RENDER_SECONDS = 5.0
MAX_RENDER_CHARS = 16 * 1024 * 1024


class TemplateLimit(UsageError):
    """A chat template that ran past the time or size limit."""


def has_thinking_switch(tokenizer) -> bool:
    """The tokenizer's chat template reads `enable_thinking` (Qwen3's switch between thinking first and
    answering at once)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates
        template = template.get("default") or ""
    return isinstance(template, str) and "enable_thinking" in template


def apply_template(tokenizer, messages: list[dict], thinking: bool | None = None) -> list[int]:
    """Prompt ids of `messages` through the tokenizer's own chat template, with the generation prompt;
    `thinking` is passed as `enable_thinking` to a template that reads it (None: its own default)."""
    extra = {"enable_thinking": thinking} if thinking is not None and has_thinking_switch(tokenizer) else {}
    with _guarded_render():
        try:
            out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                sanitize_control_tokens=True, **extra)
        except NotImplementedError:  # a template that writes no special token: nothing to forge
            out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **extra)
    if hasattr(out, "keys") and "input_ids" in out:
        out = out["input_ids"]
    if out and isinstance(out[0], list):
        out = out[0]
    return [int(t) for t in out]


_RENDER_LOCK = threading.RLock()  # the compile hook below is process-wide; renders take milliseconds


def _too_big(value) -> bool:
    return isinstance(value, (str, bytes, list, tuple)) and len(value) > MAX_RENDER_CHARS


def _size_error(what: str) -> TemplateLimit:
    return TemplateLimit(f"the model's chat template tried to build {what} larger than "
                         f"{MAX_RENDER_CHARS:,} characters; refusing to render it")


def _check_binop(operator: str, left, right) -> None:
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int) and len(seq) * max(n, 0) > MAX_RENDER_CHARS:
                raise _size_error("a repeated string")
    elif operator == "**":
        if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right * abs(left).bit_length() > 1 << 16:
            raise TemplateLimit("the model's chat template tried to compute a number of more than 65,536 bits; "
                                "refusing to render it")
    elif operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, type(left)):
        if len(left) + len(right) > MAX_RENDER_CHARS:
            raise _size_error("a string")


_ORIGINAL_COMPILE = None  # transformers' own compile (its environment: filters, globals, extensions)


def _checked(value):
    if _too_big(value):
        raise _size_error("a string")
    return value


def _checked_filter(name: str, func):
    @wraps(func)  # keeps Jinja's pass_context / pass_eval_context marks
    def run(*args, **kwargs):
        values = (*args, *kwargs.values())
        if any(isinstance(a, int) and not isinstance(a, bool) and a > MAX_RENDER_CHARS for a in values):
            raise _size_error("a value")
        if name == "replace":  # replace(s, old, new): the result's size is known before it is built
            texts = [a for a in values if isinstance(a, str)]
            if len(texts) >= 3 and texts[1] and texts[0].count(texts[1]) * len(texts[2]) > MAX_RENDER_CHARS:
                raise _size_error("a string")
        return _checked(func(*args, **kwargs))

    return run


@lru_cache(maxsize=16)
def _limited(source: str):
    """The template compiled in an overlay of transformers' environment (same filters, globals and
    extensions) whose operators, concatenations, calls and filters are size-checked. (Never through
    transformers' own compile first: Jinja folds constant expressions while compiling, so
    `'x' * 3000000000` would be built right there.)"""
    from jinja2.compiler import CodeGenerator

    class Generator(CodeGenerator):
        def visit_Concat(self, node, frame):  # `a ~ b`: the joined string is checked
            self.write("environment.checked(")
            super().visit_Concat(node, frame)
            self.write(")")

    env = _ORIGINAL_COMPILE("").environment.overlay()
    env.code_generator_class = Generator
    env.intercepted_binops = frozenset({"*", "**", "+"})  # also stops their folding at compile time
    env.filters = {name: _checked_filter(name, f) for name, f in env.filters.items()}
    env.checked = _checked
    sandbox_binop, sandbox_call = env.call_binop, env.call

    def call_binop(context, operator, left, right):
        _check_binop(operator, left, right)
        return sandbox_binop(context, operator, left, right)

    def call(__context, __obj, *args, **kwargs):
        if any(isinstance(a, int) and not isinstance(a, bool) and a > MAX_RENDER_CHARS for a in (*args, *kwargs.values())):
            raise _size_error("a value")
        return _checked(sandbox_call(__context, __obj, *args, **kwargs))

    env.call_binop, env.call = call_binop, call
    return _Counted(env.from_string(source))


class _Counted:
    """A compiled template whose render() stops once its output passes MAX_RENDER_CHARS."""

    def __init__(self, template):
        self.template = template

    def render(self, *args, **kwargs) -> str:
        parts, size = [], 0
        for part in self.template.generate(*args, **kwargs):
            size += len(part)
            if size > MAX_RENDER_CHARS:
                raise _size_error("a prompt")
            parts.append(part)
        return "".join(parts)

    def __getattr__(self, name):
        return getattr(self.template, name)


class _guarded_render:
    """Within: transformers compiles chat templates through `_limited`, and template frames run
    against a deadline."""

    def __enter__(self):
        global _ORIGINAL_COMPILE
        _RENDER_LOCK.acquire()
        self.ctu = None
        try:
            from transformers.utils import chat_template_utils as ctu
        except ImportError:  # pragma: no cover - transformers moved it: the time limit still holds
            ctu = None
        if ctu is not None and hasattr(ctu, "_compile_jinja_template"):
            self.ctu, self.original = ctu, ctu._compile_jinja_template
            _ORIGINAL_COMPILE = _ORIGINAL_COMPILE or self.original
            ctu._compile_jinja_template = _limited
        deadline = time.monotonic() + RENDER_SECONDS

        def local(frame, event, arg):
            if event == "line" and time.monotonic() > deadline:
                raise TemplateLimit(f"the model's chat template ran for more than {RENDER_SECONDS:g} s; "
                                    "refusing to render it")
            return local

        def tracer(frame, event, arg):
            return local if frame.f_code.co_filename == "<template>" else None

        self.previous = sys.gettrace()
        sys.settrace(tracer)
        return self

    def __exit__(self, *exc):
        sys.settrace(self.previous)
        if self.ctu is not None:
            self.ctu._compile_jinja_template = self.original
        _RENDER_LOCK.release()
        return False
