"""A tiny real model that reasons on cue (tests only): a random llama whose weights are rewritten into a
bigram machine, so greedy decoding writes a fixed script. After the generation prompt's last token it
writes `<think> quick brown</think> lazy dog` and ends the turn; after a prompt that already opened the
block (DeepSeek-R1's template) it goes on from `<think>`, and after an empty block (Qwen3's
`enable_thinking=False`) it answers at once. Each layer's output projections are zeroed, so the last
hidden state is the normalised embedding of the current token; the chain's embeddings are orthonormal and
each lm_head row points at the token before it, so one token decides the next exactly."""

from __future__ import annotations

import itertools
from pathlib import Path

import torch
from tiny_models import FAMILIES, build_model, random_head, tiny_tokenizer

REASONING, ANSWER = "quick brown", "lazy dog"
# a Qwen3-style switch: enable_thinking=False writes an empty block, so the model answers at once
SWITCH_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}{% endif %}"
)
# DeepSeek-R1's distills: the prompt opens the block, the reply carries only its close
OPENED_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>{% endif %}"
)
# gpt-oss's: a level written into the system turn
EFFORT_TEMPLATE = (
    "<|im_start|>system\nReasoning: {{ reasoning_effort | default('medium') }}<|im_end|>\n"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def save_thinking_pair(root, chat_template: str = SWITCH_TEMPLATE) -> tuple[Path, Path]:
    from eaglechat.engine.heads import save_head

    root = Path(root)
    tok = tiny_tokenizer()
    tok.add_tokens(["<think>", "</think>"])  # plain added tokens, as Qwen3's: the text keeps them
    tok.chat_template = chat_template
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    chain = ids("\n<think>") + ids(f" {REASONING}") + ids("</think>") + ids(f" {ANSWER}") + [tok.eos_token_id]
    assert len(set(chain)) == len(chain), "each token of the script must be unique"
    config = FAMILIES["llama"]()
    config.vocab_size = max(len(tok), 320)
    config.eos_token_id, config.bos_token_id = tok.eos_token_id, tok.bos_token_id
    model = build_model(config, seed=0)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed, lm_head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
        basis, _ = torch.linalg.qr(torch.randn(config.hidden_size, len(chain)))
        embed[chain] = basis.T * 3.0
        lm_head.zero_()
        for current, following in zip(chain, chain[1:]):
            lm_head[following] = basis.T[chain.index(current)] * 50.0
    base, head = root / "tiny-thinker", root / "tiny-thinker-head"
    model.save_pretrained(base)
    tok.save_pretrained(base)
    save_head(random_head(model), head)
    return base, head


# gpt-oss's harmony format (engine/harmony.py): its markers are special tokens; earlier answers are final messages
HARMONY_MARKERS = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"]
HARMONY_TEMPLATE = (
    "<|start|>system<|message|>Reasoning: {{ reasoning_effort | default('medium') }}<|end|>"
    "{% for m in messages %}{% if m['role'] == 'assistant' %}<|start|>assistant<|channel|>final<|message|>"
    "{{ m['content'] }}<|end|>{% else %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)
HARMONY_MESSAGES = [{"role": "user", "content": "Hello world"}]  # (no "brown" in it: see save_harmony_pair)


def harmony_reply(tok) -> list[int]:
    """The token ids of the harmony reply the model writes: its analysis, then its final answer."""
    special = tok.convert_tokens_to_ids
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    return ([special("<|channel|>")] + ids("analysis") + [special("<|message|>")] + ids(f" {REASONING}")
            + [special("<|end|>"), special("<|start|>")] + ids("assistant") + [special("<|channel|>")] + ids("final")
            + [special("<|message|>")] + ids(f" {ANSWER}") + [special("<|return|>")])


def save_harmony_pair(root) -> tuple[Path, Path]:
    """A tiny llama that answers in harmony: `<|channel|>analysis<|message|> quick brown<|end|><|start|>
    assistant<|channel|>final<|message|> lazy dog<|return|>`. <|channel|> and <|message|> come twice with a
    different next token, so one token cannot decide the next as in save_thinking_pair: the first layer's
    first attention head carries a phase, -p before " brown" was written and +p after (its query is the
    same for every token, its key is large only on " brown" and its value is +p there, -p elsewhere; both on
    the slowest rotary pair, which barely turns over a short prompt), and the lm_head rows of the two
    continuations differ by the sign of p."""
    from eaglechat.engine.heads import save_head

    root = Path(root)
    # the roles and channels one token each, as in o200k_harmony, and plain tokens: an added token the template
    # spells would be taken for a control token, and a message's role marked as text (transformers'
    # sanitize_control_tokens); "brown" is added, the key of the phase (no prompt of the tests holds it)
    tok = tiny_tokenizer(400, words=("assistant", "analysis", "final"))
    tok.add_special_tokens({"additional_special_tokens": HARMONY_MARKERS})
    tok.add_tokens(["brown"])
    tok.eos_token = "<|return|>"
    tok.chat_template = HARMONY_TEMPLATE
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    chain = ids("assistant") + harmony_reply(tok)
    key = tok.convert_tokens_to_ids("brown")
    config = FAMILIES["llama"]()
    config.vocab_size = max(len(tok), 320)
    config.eos_token_id, config.bos_token_id = tok.convert_tokens_to_ids("<|return|>"), tok.bos_token_id
    model = build_model(config, seed=0)
    unique = list(dict.fromkeys(chain))
    with torch.no_grad():
        for layer in model.model.layers:
            for weight in (layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight, layer.self_attn.v_proj.weight,
                           layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight):
                weight.zero_()
        embed, lm_head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
        basis, _ = torch.linalg.qr(torch.randn(config.hidden_size, len(unique) + 2))
        b = {t: basis[:, i] for i, t in enumerate(unique)}
        u, p = basis[:, -2], basis[:, -1]  # a direction every token has; the phase
        embed.mul_(0.1).add_(u)
        for t in unique:
            embed[t] = 3.0 * b[t] + u
        attention, slow = model.model.layers[0].self_attn, config.head_dim // 2 - 1
        attention.q_proj.weight[slow] = 4.0 * u
        attention.k_proj.weight[slow] = 4.0 * b[key]
        attention.v_proj.weight[0] = b[key] - u
        attention.o_proj.weight[:, 0] = 0.2 * p
        lm_head.zero_()
        seen = set()
        for current, following in zip(chain, chain[1:]):
            twice = chain.count(current) > 1 and len({n for c, n in zip(chain, chain[1:]) if c == current}) > 1
            phase = (1.0 if key in seen else -1.0) * p if twice else 0.0
            lm_head[following] += 50.0 * (b[current] + phase)
            seen.add(current)
    base, head = root / "tiny-harmony", root / "tiny-harmony-head"
    model.save_pretrained(base)
    tok.save_pretrained(base)
    save_head(random_head(model), head)
    return base, head


def cuts_in_three(text: str):
    """Every way of cutting `text` in three pieces (tags cut mid-way included), each with what a
    ReasoningStream fed those pieces gives: ((piece, piece, piece), (reasoning, answer))."""
    from eaglechat.chat.reasoning import ReasoningStream

    for i, j in itertools.combinations_with_replacement(range(len(text) + 1), 2):
        parts = (text[:i], text[i:j], text[j:])
        stream, got = ReasoningStream(), ["", ""]
        for part in parts:
            for k, piece in enumerate(stream.feed(part)):
                got[k] += piece
        for k, piece in enumerate(stream.flush()):
            got[k] += piece
        yield parts, tuple(got)
