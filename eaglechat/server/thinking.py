"""A reasoning model's thinking over both faces: what the served model's chat template can do (a switch,
`enable_thinking`, as Qwen3's; a level, `reasoning_effort`, as gpt-oss's; a `<think>` block it writes or
opens, as DeepSeek-R1's), and each face's request field read into GenerationParams.thinking.

Ollama's `think` (api/types.go ThinkValue): true, false or a level "low", "medium", "high", "max"; any
other value is a 400 naming `think`, and asking a model without thinking to think is Ollama's 400
`"MODEL" does not support thinking` (server/routes.go); `think: false` there is accepted. OpenAI's
`reasoning_effort` ("none", "minimal", "low", "medium", "high", "xhigh") and vLLM's and SGLang's
`chat_template_kwargs.enable_thinking` are checked the same way. A level reaches a template that reads
`reasoning_effort` as its nearest level of low/medium/high (such a template cannot turn thinking off, so
"none" and "minimal" are "low"; true or false change nothing there, as Ollama documents for gpt-oss);
a template with a switch reads any level but "none" as on. A template that always opens the block
(R1's distills) thinks whatever the request says.
"""

from __future__ import annotations

from dataclasses import dataclass

from eaglechat.chat.reasoning import OPEN
from eaglechat.engine.harmony import CHANNEL
from eaglechat.server.errors import ApiError, bad, unsupported

THINK_LEVELS = ("low", "medium", "high", "max")  # Ollama's
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")  # OpenAI's reasoning_effort
TEMPLATE_LEVEL = {"none": "low", "minimal": "low", "max": "high", "xhigh": "high"}  # the rest as they are


@dataclass(frozen=True)
class Thinking:
    switch: bool = False  # the template reads enable_thinking
    effort: bool = False  # the template reads reasoning_effort
    tags: bool = False  # the template writes <think> (the model's reasoning comes in such a block)
    harmony: bool = False  # the template writes harmony's channels (the reasoning is the analysis channel)
    opens: bool = False  # the generation prompt itself opens the block (R1's): replies carry only the close

    @classmethod
    def of(cls, engine) -> Thinking:
        template = getattr(getattr(engine, "tokenizer", None), "chat_template", None)
        if isinstance(template, dict):  # several named templates
            template = template.get("default")
        text = template if isinstance(template, str) else ""
        return cls(switch=engine.info.thinking_switch or "enable_thinking" in text,
                   effort="reasoning_effort" in text, tags=OPEN in text, harmony=CHANNEL in text,
                   opens=OPEN in text and prompt_opens(engine))

    @property
    def capable(self) -> bool:
        return self.switch or self.effort or self.tags or self.harmony

    @property
    def splits(self) -> bool:
        """Replies carry reasoning to keep apart from the answer: a <think> block, or harmony's analysis
        channel."""
        return self.switch or self.tags or self.harmony

    def resolve(self, wants: bool | None, level: str | None, *, param: str, model: str) -> bool | str | None:
        """(think or not, the level asked for) -> GenerationParams.thinking; a 400 naming `param` when
        a model without thinking is asked to think."""
        if not self.capable:
            if wants:
                raise ApiError(400, f'"{model}" does not support thinking', param=param, code="unsupported_parameter")
            return None
        if self.effort and level is not None:
            return TEMPLATE_LEVEL.get(level, level)
        return wants if self.switch else None


def ollama_think(body: dict, thinking: Thinking, model: str) -> bool | str | None:
    value = body.get("think")
    if value is None or isinstance(value, bool):
        return thinking.resolve(value, None, param="think", model=model)
    if value not in THINK_LEVELS:
        raise bad("think", f"invalid think value: {value!r} (must be \"high\", \"medium\", \"low\", \"max\", true, "
                  "or false)")
    return thinking.resolve(True, value, param="think", model=model)


def openai_thinking(body: dict, thinking: Thinking, model: str) -> bool | str | None:
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in EFFORTS:
        raise bad("reasoning_effort", f"'reasoning_effort' must be one of {', '.join(EFFORTS)}")
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise bad("chat_template_kwargs", "'chat_template_kwargs' must be an object")
    for name in kwargs:
        if name != "enable_thinking":
            raise unsupported(f"chat_template_kwargs.{name}", "only enable_thinking is passed to the chat template")
    enable = kwargs.get("enable_thinking")
    if enable is not None and not isinstance(enable, bool):
        raise bad("chat_template_kwargs.enable_thinking", "'chat_template_kwargs.enable_thinking' must be true or false")
    if enable is not None:
        return thinking.resolve(enable, effort if enable else None, param="chat_template_kwargs.enable_thinking",
                                model=model)
    if effort is None:
        return thinking.resolve(None, None, param="reasoning_effort", model=model)
    return thinking.resolve(effort != "none", effort, param="reasoning_effort", model=model)


def prompt_opens(engine) -> bool:
    """The model's generation prompt for a one-line message ends with the opening tag (R1's template), as
    server/core.py reads each request's; the card says so, for a client that cannot render the prompt."""
    encode, tokenizer = getattr(engine, "encode", None), getattr(engine, "tokenizer", None)
    if encode is None or tokenizer is None:
        return False
    try:
        return tokenizer.decode(encode([{"role": "user", "content": "Hi"}])[-16:]).rstrip().endswith(OPEN)
    except Exception:  # noqa: BLE001 - a template that refuses this message: the card says no
        return False
