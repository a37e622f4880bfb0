"""The process that renders a model folder's chat template (see engine/templates.py).

A chat template is Jinja code from the model folder. Jinja's sandbox stops attribute escapes but
neither time nor memory, and no in-process check can stop one C call that builds a 2 GB string
(`'%*d' % (1500000000, 1)`) or sorts for a minute. So templates render here, in a process of their
own: its address space is capped (RLIMIT_AS, set after the imports), and the parent kills it when a
render runs past its time.

Protocol, one render at a time: the parent writes a 4-byte length and a pickled request (the parent
is trusted; the worker unpickles only what the parent wrote); the worker answers one JSON line,
{"text": ...} or {"error": "memory" | "size" | "template", "message": ...}. A line "ready" first, once
the imports are done and the limit is set. The worker ends when its stdin closes (the parent ended).
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import sys
from types import SimpleNamespace


def _cap_address_space(budget: int) -> None:
    """Limit the address space to what is mapped now plus `budget` bytes (Linux; elsewhere the parent's
    output cap and time limit still hold)."""
    try:
        import resource

        with open("/proc/self/status") as status:
            mapped = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (mapped + budget, mapped + budget))
    except (ImportError, OSError, StopIteration, ValueError):
        pass


def _cap_cpu(seconds: float) -> None:
    """End this process (SIGXCPU) if the coming render uses more than twice its time in CPU: the parent
    kills a render at its time limit, this holds also when the parent itself was killed meanwhile."""
    try:
        import resource

        usage = resource.getrusage(resource.RUSAGE_SELF)
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        soft = int(usage.ru_utime + usage.ru_stime + 2 * seconds) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
    except (ImportError, OSError, ValueError):
        pass


def _answer(out, reply: dict) -> None:
    out.write(json.dumps(reply, ensure_ascii=False).encode("utf-8", "surrogatepass") + b"\n")
    out.flush()


def _marked(request: dict) -> list[dict]:
    """The messages with the control tokens they spell wrapped in transformers' markers, so the
    tokenizer encodes them as text (transformers' apply_chat_template(sanitize_control_tokens=True);
    here because finding the template's control tokens compiles the template)."""
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase
    from transformers.utils.chat_template_utils import _get_control_token_patterns, mark_control_tokens

    tokenizer = SimpleNamespace(  # what _get_control_tokens reads of a tokenizer
        added_tokens_decoder={i: SimpleNamespace(content=content, special=special)
                              for i, (content, special) in enumerate(request["added_tokens"])},
        chat_control_tokens=request["chat_control_tokens"])
    tokens = PreTrainedTokenizerBase._get_control_tokens(tokenizer, request["template"])
    return mark_control_tokens(request["messages"], _get_control_token_patterns(tokens)[0])


def _render(request: dict) -> dict:
    from transformers.utils.chat_template_utils import render_jinja_template

    try:
        messages = _marked(request) if request["sanitize"] else request["messages"]
        rendered, _ = render_jinja_template(
            conversations=[messages], chat_template=request["template"],
            add_generation_prompt=True, **request["variables"])
        text = rendered[0]
    except MemoryError:
        return {"error": "memory"}
    except RecursionError:
        return {"error": "template", "message": "it recursed too deeply"}
    except Exception as exc:  # noqa: BLE001 - raise_exception('roles must alternate'), a sandbox refusal: the template's word
        return {"error": "template", "message": str(exc)[:500]}
    if len(text) > request["max_chars"]:
        return {"error": "size"}
    return {"text": text}


def main() -> None:
    # run as `python -m eaglechat.engine.template_worker`: eaglechat's import has marked Hub kernels absent
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase  # noqa: F401 - imported before the cap
    from transformers.utils.chat_template_utils import render_jinja_template  # noqa: F401

    # Jinja's sandboxed environment is built on the first render: build it now, outside any render's time
    _render({"template": "{{ messages | length }}", "messages": [], "variables": {}, "sanitize": False, "max_chars": 10})
    budget = int(sys.argv[1])
    _cap_address_space(budget)
    source = sys.stdin.buffer
    out = os.fdopen(os.dup(1), "wb")  # the answers' own channel: a print in a library cannot garble it
    os.dup2(2, 1)
    _answer(out, {"ready": True})
    while True:
        head = source.read(4)
        if len(head) < 4:
            return
        request = pickle.loads(source.read(struct.unpack(">I", head)[0]))
        _cap_cpu(request["seconds"])
        try:
            reply = _render(request)
            _answer(out, reply)
        except MemoryError:  # the answer itself did not fit
            _answer(out, {"error": "memory"})


if __name__ == "__main__":
    main()
