"""Penalties on tokens already seen, kept on the device for one reply, exact in plain decoding and in
tree verification (each tree node penalised by its own context: the tokens before the tree and those on
its path, root to node; so greedy EAGLE equals plain greedy with any of them on).

* The repetition penalty of CTRL (arXiv:1909.05858; transformers' RepetitionPenaltyLogitsProcessor)
  over the whole context (`repeat_last_n` -1, transformers' and vLLM's rule) or over its last
  `repeat_last_n` tokens (llama.cpp's `penalty_last_n`, Ollama's `repeat_last_n`, 64 by default there),
  prompt tokens included.
* OpenAI's presence and frequency penalties over the generated tokens only (the prompt excluded, as
  OpenAI and vLLM define them): logit -= frequency_penalty x count + presence_penalty x (count > 0),
  after the repetition penalty (vLLM's order), before temperature.
"""

from __future__ import annotations

import torch

from eaglechat.engine.protocol import GenerationParams
from eaglechat.engine.sampling import penalize, seen_on_paths


def wanted(params: GenerationParams) -> bool:
    return Penalties.layout_of(params) != (0, False)


class Penalties:
    """The device state of one reply's penalties: what the committed context holds (a [V] mask for the
    whole context, or its last N tokens), the generated tokens' counts, and the penalty values.

    A captured decode step (engine/compile.py) reads these at fixed addresses, so they are allocated once
    per layout (which penalties, the window's length) and refilled in place for each reply (`load`); the
    values are device tensors, so a new penalty value replays the same graph."""

    def __init__(self, params: GenerationParams, vocab: int, device: torch.device):
        self.vocab, self.device = vocab, device
        self.layout = self.layout_of(params)
        self.window, with_counts = self.layout  # window -1: the whole context; 0: no repetition penalty
        self.seen = torch.zeros(vocab, dtype=torch.bool, device=device) if self.window < 0 else None
        # the last N context tokens, oldest first; `vocab` pads a short context
        self.recent = torch.zeros(self.window, dtype=torch.long, device=device) if self.window > 0 else None
        self.counts = torch.zeros(vocab, dtype=torch.float32, device=device) if with_counts else None
        self.repeat, self.presence, self.frequency = (torch.ones((), device=device) for _ in range(3))

    @staticmethod
    def layout_of(params: GenerationParams) -> tuple[int, bool]:
        """(the repetition penalty's window: -1 whole context, N last tokens, 0 none; whether generated
        tokens are counted): what the buffers are, and what a captured step depends on."""
        repeat = params.repetition_penalty if params.repeat_last_n != 0 else 1.0
        return params.repeat_last_n if repeat != 1.0 else 0, bool(params.presence_penalty or params.frequency_penalty)

    def fits(self, params: GenerationParams, vocab: int) -> bool:
        """Whether these buffers serve `params` (the same layout): then `load` refills them."""
        return self.vocab == vocab and self.layout == self.layout_of(params)

    def load(self, params: GenerationParams, prompt_ids: list[int]) -> Penalties:
        """Refill in place for a reply to `prompt_ids` with `params`' values."""
        prompt = torch.tensor(prompt_ids, dtype=torch.long, device=self.device)
        if self.seen is not None:
            self.seen.zero_()
            self.seen[prompt] = True
        if self.recent is not None:
            pad = torch.full((max(0, self.window - prompt.numel()),), self.vocab, dtype=torch.long, device=self.device)
            self.recent.copy_(torch.cat([pad, prompt[-self.window:]]))
        if self.counts is not None:
            self.counts.zero_()
        self.repeat.fill_(params.repetition_penalty if self.window else 1.0)
        self.presence.fill_(params.presence_penalty or 0.0)
        self.frequency.fill_(params.frequency_penalty or 0.0)
        return self

    def key(self) -> tuple:
        """The layout a captured step depends on (the values are tensors it reads)."""
        return self.layout

    def buffers(self) -> list[torch.Tensor]:
        return [b for b in (self.seen, self.recent, self.counts) if b is not None] + [
            self.repeat, self.presence, self.frequency]

    def apply(self, logits: torch.Tensor, seen: torch.Tensor | None, counts: torch.Tensor | None) -> torch.Tensor:
        if seen is not None:
            logits = penalize(logits, seen, self.repeat)
        else:
            logits = logits.float()
        if counts is not None:
            logits = logits - self.frequency * counts - self.presence * (counts > 0).float()
        return logits

    def root(self, logits: torch.Tensor) -> torch.Tensor:
        """The first reply token's logits [V] (the context is the prompt; nothing generated yet)."""
        seen = self.seen
        if self.recent is not None:
            seen = torch.zeros(self.vocab + 1, dtype=torch.bool, device=logits.device)
            seen[self.recent] = True
            seen = seen[: self.vocab]
        return self.apply(logits, seen, self.counts)

    def tree(self, logits: torch.Tensor, tokens: torch.Tensor, ancestors: torch.Tensor,
             depth: torch.Tensor) -> torch.Tensor:
        """Each node's logits [T, V] penalised by its own context: the committed one and its path."""
        t = tokens.numel()
        seen = None
        if self.seen is not None:
            seen = seen_on_paths(self.seen, tokens, ancestors)
        elif self.recent is not None:
            n = self.window
            length = depth + 1  # path tokens, root to node
            # the node's last n context tokens: its path's last n, then the committed ones before them
            from_recent = torch.arange(n, device=tokens.device)[None, :] >= length[:, None]  # [T, n]
            from_path = ancestors & (length[None, :] > length[:, None] - n)  # [T, T]
            ids = torch.cat([self.recent[None, :].expand(t, n), tokens[None, :].expand(t, t)], dim=1)
            keep = torch.cat([from_recent, from_path], dim=1).to(torch.int32)
            rows = torch.zeros(t, self.vocab + 1, dtype=torch.int32, device=tokens.device)
            seen = rows.scatter_reduce(1, ids, keep, reduce="amax")[:, : self.vocab].bool()
        counts = None
        if self.counts is not None:
            on_path = torch.zeros(t, self.vocab, dtype=torch.float32, device=tokens.device)
            counts = self.counts[None, :] + on_path.scatter_add(1, tokens[None, :].expand(t, t), ancestors.float())
        return self.apply(logits, seen, counts)

    def commit(self, on_path: torch.Tensor, count: torch.Tensor) -> None:
        """The step's root and accepted drafts (`on_path[:count]`, count a device [1]) join the context."""
        kept = torch.arange(on_path.numel(), device=on_path.device) < count
        if self.seen is not None:  # padding entries repeat the root
            self.seen.index_fill_(0, torch.where(kept, on_path, on_path[:1]), True)
        if self.recent is not None:  # the last n of (recent + on_path[:count])
            both = torch.cat([self.recent, on_path])
            self.recent.copy_(both.index_select(0, torch.arange(self.window, device=on_path.device) + count))
        if self.counts is not None:
            self.counts.index_add_(0, on_path, kept.float())
