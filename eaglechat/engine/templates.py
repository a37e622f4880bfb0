"""Prompt formats for bases whose tokenizer has no chat template (SafeAILab/EAGLE
`eagle/evaluation/gen_ea_answer_*.py`, which build them with FastChat's conversation templates).

The official EAGLE heads were trained on these exact formats; a different one collapses acceptance.
"tokenizer" means: use the base tokenizer's own chat template (Llama-3, Qwen2, SmolLM2, ...).
"""

from __future__ import annotations

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


def render(name: str, messages: list[dict], default_system: str | None = None) -> str:
    try:
        return NAMED[name](messages, default_system)
    except KeyError:
        raise UsageError(f"unknown prompt template {name!r} (known: tokenizer, {', '.join(NAMED)})") from None
