"""Tiny random base models of the target families, and heads for them (tests only).

FAMILIES: the four 2023-24 families (3 layers). ARCHITECTURES: the base architectures people run in 2026,
each a 2-layer random config of its real transformers `model_type`, with what makes it different turned
on: a sliding window shorter than a reply, MoE routing, attention sinks, Gated DeltaNet layers, Gemma 4's
per-layer attention shapes and KV-shared layers."""

from __future__ import annotations

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
)

from eaglechat.engine.heads import EagleHead, HeadConfig, init_weights

COMMON = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=False,
)

FAMILIES = {
    "llama": lambda: LlamaConfig(**COMMON),
    "qwen2": lambda: Qwen2Config(**COMMON),  # q/k/v bias
    "qwen3": lambda: Qwen3Config(**COMMON, head_dim=16),  # q/k norm
    "mistral": lambda: MistralConfig(**COMMON, sliding_window=None),
}

TINY = {**COMMON, "num_hidden_layers": 2, "head_dim": 16}
WINDOWED = dict(sliding_window=4, layer_types=["sliding_attention", "full_attention"])  # window < reply
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
DELTANET = dict(layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2, linear_num_value_heads=4,
                linear_key_head_dim=16, linear_value_head_dim=16)
# Gemma 4 (26B-A4B's structure, shrunk): sliding and global layers of different head_dim and KV heads, values
# = keys on global layers, the last two layers reusing earlier layers' KV, a dense MLP beside top-2 of 4 experts,
# final logit soft-capping low enough to change the distribution, bidirectional attention for image tokens only
GEMMA4 = dict(num_hidden_layers=6, layer_types=["sliding_attention", "full_attention"] * 3, sliding_window=4,
              global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True, num_kv_shared_layers=2,
              enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32,
              final_logit_softcapping=2.0, use_bidirectional_attention="vision", hidden_size_per_layer_input=0)
ARCHITECTURES_KWARGS = {
    "qwen3_moe": MOE,
    "gemma3_text": WINDOWED,
    "ministral": WINDOWED,
    "ministral3": {},
    "phi3": dict(pad_token_id=None),
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2, **WINDOWED,  # + attention sinks
                    rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                                     "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 16}),
    "qwen3_next": dict(**MOE, shared_expert_intermediate_size=32, **DELTANET),
    "qwen3_5_text": DELTANET,
    "qwen3_5_moe_text": dict(**MOE, shared_expert_intermediate_size=32, **DELTANET),
    "gemma4_text": GEMMA4,
}
ARCHITECTURES = {kind: (lambda kind=kind, kw=kw: AutoConfig.for_model(kind, **{**TINY, **kw}))
                 for kind, kw in ARCHITECTURES_KWARGS.items()}
ALL = {**FAMILIES, **ARCHITECTURES}


def build_model(config, seed: int = 0, scale: float | None = None):
    """The one way the tests build a random base model from a config: seeded, float32, with the attention
    eaglechat's loader asks for; `scale` multiplies the 2-D weights but the embeddings, so a wrong mask,
    position or kernel shows in the logits."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=attention_for(config))
    if scale is not None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 2 and "embed" not in name:
                    p.mul_(scale)
    return model.eval()


def tiny_model(family: str = "llama", seed: int = 0, scale: float = 4.0):
    """A random model of one of the families (or 2026 architectures) above, weights scaled up."""
    return build_model(ALL[family](), seed, scale)


def attention_for(config) -> str:
    """What eaglechat's loader asks for: sdpa, or eager where transformers refuses it (gpt-oss's sinks)."""
    from eaglechat.loader import attention_implementation

    return attention_implementation(config)


def random_head(model, seed: int = 1, bias: bool = True) -> EagleHead:
    torch.manual_seed(seed)
    head = EagleHead(HeadConfig.for_base(model.config, bias=bias), model.get_input_embeddings(), model.get_output_embeddings())
    return init_weights(head, std=0.1).eval()


CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_tokenizer(vocab_size: int = 320, words: tuple[str, ...] = ()):
    """A byte-level BPE trained on a few sentences (and `words`, often enough to be one token each), with
    ChatML special tokens (ids 0-2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    corpus = ["The quick brown fox jumps over the lazy dog.", "Hello world! Speculative decoding is exact.",
              "caf\u00e9 na\u00efve \u00fcber \u65e5\u672c\u8a9e \U0001f985 eagle"] * 20 + ["\n".join(words)] * 100 * bool(words)
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>", unk_token="<|endoftext|>",
        pad_token="<|im_end|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tiny_pair(root, family: str = "llama", bias: bool = True, seed: int = 0, special_tokens: tuple = (),
                   chat_template: str | None = None):
    """A tiny base model folder (with tokenizer and chat template) and a random EAGLE head folder;
    `special_tokens` are added to the tokenizer (e.g. fill-in-the-middle markers)."""
    from pathlib import Path

    from eaglechat.engine.heads import save_head

    root = Path(root)
    tok = tiny_tokenizer()
    if special_tokens:
        tok.add_special_tokens({"additional_special_tokens": list(special_tokens)})
    if chat_template is not None:
        tok.chat_template = chat_template
    config = ALL[family]()
    config.vocab_size = max(len(tok), 320)
    config.eos_token_id = tok.eos_token_id
    config.bos_token_id = tok.bos_token_id
    model = build_model(config, seed)
    base_dir, head_dir = root / f"tiny-{family}", root / f"tiny-{family}-head"
    model.save_pretrained(base_dir)
    tok.save_pretrained(base_dir)
    save_head(random_head(model, seed=seed + 1, bias=bias), head_dir)
    return base_dir, head_dir
