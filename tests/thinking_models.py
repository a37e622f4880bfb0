"""A tiny real model that reasons on cue (tests only): a random llama whose weights are rewritten into a
bigram machine, so greedy decoding writes a fixed script. After the generation prompt's last token it
writes `<think> quick brown</think> lazy dog` and ends the turn; after a prompt that already opened the
block (DeepSeek-R1's template) it goes on from `<think>`, and after an empty block (Qwen3's
`enable_thinking=False`) it answers at once. Each layer's output projections are zeroed, so the last
hidden state is the normalised embedding of the current token; the chain's embeddings are orthonormal and
each lm_head row points at the token before it, so one token decides the next exactly."""

from __future__ import annotations

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
