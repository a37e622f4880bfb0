"""LocalEngine: the Engine protocol over a loaded base model + draft head (chat template, stops,
streaming text, stats). Turns of one conversation reuse the KV cache of their common prefix."""

from __future__ import annotations

import threading
from typing import Iterator

import torch

from eaglechat.engine.context import fit_conversation, reply_reserve
from eaglechat.engine.decode import Decoder
from eaglechat.engine.decode import PrefillProgress as OnPrefillProgress
from eaglechat.engine.harmony import END, REPLY_ENDS, is_harmony
from eaglechat.engine.protocol import (
    EngineInfo,
    Event,
    Finished,
    GenerationParams,
    PrefillProgress,
    StopReason,
    TextDelta,
    TreeBudget,
)
from eaglechat.engine.text import Detokenizer
from eaglechat.errors import OutOfMemory, UsageError

# end-of-turn markers of common chat templates; used as stops when the vocabulary has them
TEMPLATE_STOPS = ["<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "</s>", "<end_of_turn>", "<|end|>"]


def stop_token_ids(tokenizer, model, extra: list[str] = ()) -> set[int]:
    """eos ids of the model's generation config, its config and the tokenizer (None: model only), plus
    the chat-format stop strings the tokenizer knows. A harmony vocabulary (gpt-oss) ends a reply at
    <|return|> or <|call|>, never at <|end|> (Phi-3's end of turn, but there the end of one message of
    the reply, its analysis before the final answer: engine/harmony.py)."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        eos = getattr(source, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, (list, tuple)):
            ids.update(int(e) for e in eos)
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    harmony = is_harmony(tokenizer)
    for text in [*TEMPLATE_STOPS, *extra, *(REPLY_ENDS if harmony else ())]:
        if text in vocab:
            ids.add(vocab[text])
    if harmony:
        ids.discard(vocab[END])
    return ids


class LocalEngine:
    def __init__(self, model, tokenizer, head, *, info: EngineInfo, stop_ids: set[int],
                 template: str = "tokenizer", default_system: str | None = None):
        self.model, self.tokenizer, self.head = model, tokenizer, head
        self.template, self.default_system = template, default_system
        self.info = info
        self.stop_ids = stop_ids
        # harmony's markers say where the reasoning ends and the answer starts: the text keeps them
        self.keep_special = is_harmony(tokenizer)
        if template == "tokenizer":
            from eaglechat.engine.templates import has_thinking_switch

            info.thinking_switch = has_thinking_switch(tokenizer)
        self.decoder = Decoder(model, head, info.max_context, info.prefill_chunk)
        self._lock = threading.Lock()
        self._runner_factory = None  # decoder -> its step runner (engine/compile.py), kept for a rebuilt decoder
        self._runner = None  # the runner it built (it says why, when it gives way to eager decoding)
        if template == "tokenizer" and getattr(tokenizer, "chat_template", None):
            from eaglechat.engine.templates import warm

            warm()  # the chat template renders in a process of its own; start it now, not on the first turn

    def use_steps(self, factory, mode: str) -> None:
        """Decode through the step runner `factory` builds (engine/compile.py; None: eagerly), `mode` its
        name ("graphs", "inductor", "eager"); kept when the decoder is rebuilt."""
        self._runner_factory = factory
        self._runner = factory(self.decoder) if factory is not None else None
        self.decoder.use(self._runner)
        self.info.steps = mode if factory is not None else "eager"

    @property
    def budget(self) -> TreeBudget:
        return self.info.tree

    def encode(self, messages: list[dict], thinking: bool | str | None = None) -> list[int]:
        if not any((m.get("content") or "").strip() for m in messages if m.get("role") == "user"):
            raise UsageError("empty prompt")
        if self.template != "tokenizer":  # a named format the head was trained on (Vicuna, LLaMA-2-chat)
            from eaglechat.engine.templates import encode_named

            return encode_named(self.tokenizer, self.template, messages, self.default_system)
        if self.default_system and not any(m.get("role") == "system" for m in messages):
            messages = [{"role": "system", "content": self.default_system}, *messages]
        if getattr(self.tokenizer, "chat_template", None):
            from eaglechat.engine.templates import apply_template
            from eaglechat.errors import EaglechatError

            try:
                return apply_template(self.tokenizer, messages, thinking)  # time and size limits; typed tokens stay text
            except EaglechatError:
                raise
            except Exception as exc:  # noqa: BLE001 - e.g. raise_exception('roles must alternate'): the template's word
                raise UsageError(f"the model's chat template refused the conversation: {exc}") from None
        # a base model without a chat template: plain text continuation of the conversation
        text = "\n".join(m["content"] for m in messages if m.get("content"))
        return self.tokenizer(text)["input_ids"]

    def generate(
        self, messages: list[dict], params: GenerationParams, cancel: threading.Event | None = None,
        on_prefill_progress: OnPrefillProgress | None = None,
    ) -> Iterator[Event]:
        """The Engine protocol; `on_prefill_progress(done, total)` reports prompt tokens read (before the
        first prefill chunk and after each), so a UI can show "reading prompt (N tokens)"."""
        with self._lock:
            prompt_ids, dropped = self.fit(messages, params)
            yield from self.generate_ids(prompt_ids, params, cancel, on_prefill_progress, dropped)

    @property
    def can_fill_in_middle(self) -> bool:
        from eaglechat.engine.fim import fim_tokens

        return fim_tokens(self.tokenizer) is not None

    def complete(self, prompt: str, params: GenerationParams, cancel: threading.Event | None = None,
                 suffix: str | None = None) -> Iterator[Event]:
        """Raw text continuation, no chat template (OpenAI's /v1/completions, Ollama's raw generate);
        with `suffix`, fill-in-the-middle in the tokenizer's own FIM format (engine/fim.py)."""
        from eaglechat.engine.fim import fim_prompt

        with self._lock:
            ids = fim_prompt(self.tokenizer, prompt, suffix) if suffix else self.tokenizer(prompt)["input_ids"]
            if not ids:
                raise UsageError("empty prompt")
            if len(ids) + 1 > self.info.max_context:
                from eaglechat.errors import ContextTooLong

                raise ContextTooLong(f"the prompt is {len(ids)} tokens but the context limit is {self.info.max_context}")
            yield from self.generate_ids(list(ids), params, cancel)

    def embed(self, inputs: list[str | list[int]], truncate: bool = True) -> tuple[list[list[float]], int]:
        """Embeddings of texts (or token ids) from the base model: its last hidden states (after the final
        norm) mean-pooled over the input's tokens and L2-normalised (unit length, as Ollama returns them).
        An input beyond the context is cut to its first tokens (`truncate`) or refused.
        -> (one vector per input, tokens read)."""
        vectors, tokens = [], 0
        limit = self.info.max_context - 1
        with self._lock:
            for i, item in enumerate(inputs):
                ids = list(item) if isinstance(item, list) else self.tokenizer(item)["input_ids"]
                if not ids:
                    raise UsageError(f"input {i} is empty")
                vocab = self.model.get_input_embeddings().num_embeddings
                if not all(0 <= t < vocab for t in ids):
                    raise UsageError(f"input {i} holds a token id outside this model's vocabulary (0..{vocab - 1})")
                if len(ids) > limit:
                    if not truncate:
                        from eaglechat.errors import ContextTooLong

                        raise ContextTooLong(f"input {i} is {len(ids)} tokens but the context limit is {limit + 1}")
                    ids = ids[:limit]
                mean = self.decoder.embed(ids)
                vectors.append(torch.nn.functional.normalize(mean, dim=0).tolist())
                tokens += len(ids)
        return vectors, tokens

    def fit(self, messages: list[dict], params: GenerationParams) -> tuple[list[int], int]:
        """The prompt ids of the conversation's tail that fits the context (engine/context.py)."""
        reserve = reply_reserve(self.info.max_context, params.max_new_tokens)
        def encode(conversation: list[dict]) -> list[int]:
            return self.encode(conversation, params.thinking)

        return fit_conversation(messages, encode, self.info.max_context, reserve)

    def count_tokens(self, messages: list[dict]) -> int:
        """Prompt tokens of these messages (the chat refuses a message that cannot fit before sending)."""
        return len(self.encode(messages))

    def generate_ids(self, prompt_ids: list[int], params: GenerationParams, cancel=None,
                     on_prefill_progress: OnPrefillProgress | None = None, dropped: int = 0) -> Iterator[Event]:
        detok = Detokenizer(self.tokenizer, keep_special=self.keep_special)
        ids: list[int] = []
        while True:
            try:
                for step in self.decoder.generate(prompt_ids, params, self.budget, self.stop_ids, cancel,
                                                  on_prefill_progress, report_prefill=True):
                    if step.prefill is not None:
                        yield PrefillProgress(*step.prefill, prompt_tokens=len(prompt_ids),
                                              dropped_messages=dropped)
                        continue
                    ids.extend(step.tokens)
                    texts = [detok.add([t]) for t in step.tokens]  # one token at a time: exact boundaries
                    yield TextDelta("".join(texts), step.tokens, step.drafted, step.stats, texts)
                break
            except torch.OutOfMemoryError:
                shrink = self._shrink_after_oom(len(prompt_ids) + len(ids))
                if ids:  # part of the reply is out: keep it, end the turn, and the next turn runs smaller
                    yield Finished(detok.text + detok.flush(), ids, self.decoder.stats, StopReason.OOM, shrink)
                    return
                # nothing emitted yet: retry transparently with the smaller settings
        tail = detok.flush()
        if tail:
            yield TextDelta(tail, [], [], None)
        stats = self.decoder.stats
        stats.prompt_tokens, stats.dropped_messages = len(prompt_ids), dropped
        reason = self.decoder.stop_reason
        message = f"stopped: reached the context limit ({self.info.max_context} tokens)" if reason == StopReason.CONTEXT else ""
        if self._runner is not None and self._runner.failure:  # gave way to eager decoding: said once, here
            message = "; ".join(m for m in (message, self._runner.failure) if m)
            self._runner_factory, self._runner, self.info.steps = None, None, "eager"
        yield Finished(detok.text, ids, stats, reason, message)

    def _shrink_after_oom(self, used_tokens: int) -> str:
        """Out of memory: shrink the tree, then the context (engine/oom.py), and say so;
        when nothing is left to give back, raise one clear error (the chat shows it and stays open)."""
        from dataclasses import replace

        from eaglechat.engine.oom import shrink_after_oom

        self.decoder.reset()
        tree, context = self.info.tree, self.info.max_context
        shrink = shrink_after_oom(tree.total_tokens, tree.depth, tree.draft_top_k, context, used_tokens=used_tokens)
        if shrink is None:
            raise OutOfMemory(
                f"out of memory on {self.info.device} even with a {tree.total_tokens}-token tree and a "
                f"{context}-token context; try --quant 4bit or a smaller model"
            )
        self.info.tree = replace(tree, total_tokens=shrink.total_tokens, depth=shrink.depth, draft_top_k=shrink.draft_top_k)
        if shrink.context != context:
            self.info.max_context = shrink.context
            self.decoder = Decoder(self.model, self.head, shrink.context, self.info.prefill_chunk)  # frees the larger cache
            if self._runner_factory is not None:
                self.use_steps(self._runner_factory, self.info.steps)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return shrink.message
