"""Acceptance: which drafted path the target model agrees with, plus the bonus token after it.

Everything here runs on the device in shapes fixed by the tree budget (no host reads): the decode loop
reads the outcome once per step (`Verdict.summary`).

Greedy: a node is accepted when its token equals the target's argmax at its parent, and so is every
ancestor's; the deepest accepted node ends the path, and the target's argmax there is the bonus.
Sampling (arXiv:2406.16858 / SafeAILab/EAGLE `evaluate_posterior`): at each node, try the distinct
children in draft order; accept child x with probability p(x) under the *processed* target distribution
p; on rejection zero p(x) and renormalise. When no child is accepted (or at a leaf), the bonus token is
sampled from what is left. Each emitted token is then distributed exactly as plain sampling from p (the
draft is a point mass).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eaglechat.engine.protocol import GenerationParams
from eaglechat.engine.rng import CounterRNG
from eaglechat.engine.sampling import is_greedy, sample, target_probs
from eaglechat.engine.tree import DraftTree


@dataclass
class Verdict:
    """The outcome of one verify step, on the device, in shapes fixed by the tree."""

    summary: torch.Tensor  # [max_depth + 2]: accepted drafts a, then the a accepted tokens, then the bonus
    path: torch.Tensor  # [max_depth + 1] tree nodes root first (entries past a are padding)
    count: torch.Tensor  # [1] tokens the step emits: a + 1
    next_tokens: torch.Tensor  # [max_depth + 1] the token after each path node (summary[1:])
    bonus: torch.Tensor  # [1] the next root


def greedy_accept(tree: DraftTree, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (last accepted node [1], bonus token [1])."""
    predicted = logits.argmax(dim=-1)  # [T]
    match = (tree.tokens == predicted[tree.parents.clamp(min=0)]) & tree.valid
    match[0] = True  # the root is already emitted
    accepted = ~(tree.ancestors & ~match[None, :]).any(dim=-1)  # every node on its path matches
    best = torch.where(accepted, tree.depth, -1).argmax().reshape(1)  # the deepest; ties cannot occur
    return best, predicted.index_select(0, best)  # between distinct sibling tokens


def child_table(tree: DraftTree) -> torch.Tensor:
    """[T, max_children]: each node's valid children in draft order (= tree order), padded with T."""
    t = tree.size
    steps = torch.arange(t, device=tree.tokens.device)
    is_child = (tree.parents[None, :] == steps[:, None]) & tree.valid[None, :]
    return torch.sort(torch.where(is_child, steps[None, :], t), dim=1).values[:, : tree.max_children]


def sample_accept(
    tree: DraftTree, logits: torch.Tensor, params: GenerationParams, rng: CounterRNG
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tree rejection sampling, one level per iteration (max_depth of them), all children of a level at
    once: child j (draft order, duplicates skipped) is accepted with probability p(x_j) / (1 - sum of
    p(x_i), i < j), which is p(x_j) after the earlier rejected children were zeroed and p renormalised.
    -> (last accepted node [1], bonus token [1])."""
    t, k = tree.size, tree.max_children
    probs = target_probs(logits, params)  # [T, V]
    kids = child_table(tree)
    # the uniforms of every child that could be tried, drawn at once (only the tried ones matter)
    uniforms = rng.uniform((tree.max_depth, max(k, 1)))
    earlier = torch.ones(k, k, dtype=torch.bool, device=logits.device).tril(-1)
    node = torch.zeros(1, dtype=torch.long, device=logits.device)
    walking = torch.ones(1, dtype=torch.bool, device=logits.device)
    p = probs[0]
    for level in range(tree.max_depth):
        row = kids.index_select(0, node)[0]  # [K]
        x = tree.tokens[row.clamp(max=t - 1)]
        tried = (row < t) & walking & ~((x[:, None] == x[None, :]) & earlier).any(dim=1)
        px = torch.where(tried, p.gather(0, x), 0.0)
        left = (1.0 - (px.cumsum(0) - px)).clamp(min=1e-30)
        hit = tried & (uniforms[level, :k] < px / left)
        moved = hit.any().reshape(1)
        child = row.gather(0, hit.int().argmax().reshape(1))  # the first accepted child
        residual = p.masked_fill(torch.zeros_like(p).index_add_(0, x, tried.to(p.dtype)) > 0, 0.0)
        residual = torch.where(residual.sum() > 0, residual, p)  # float round-off: nothing left to sample
        node = torch.where(moved, child, node)
        p = torch.where(moved, probs.index_select(0, node)[0], residual)
        walking = walking & moved
    return node, sample(p, rng).reshape(1)


def accept(tree: DraftTree, logits: torch.Tensor, params: GenerationParams, rng: CounterRNG):
    """-> (last accepted node [1], bonus token [1]): greedy or tree rejection sampling."""
    if is_greedy(params):
        return greedy_accept(tree, logits)
    return sample_accept(tree, logits, params, rng)


def settle(tree: DraftTree, best: torch.Tensor, bonus: torch.Tensor) -> Verdict:
    """The accepted path to `best`, in fixed shapes: what the KV cache keeps and the step emits."""
    t, d = tree.size, tree.max_depth
    on_path = tree.ancestors.index_select(0, best)[0]  # [T]
    steps = torch.arange(t, device=best.device)
    path = torch.sort(torch.where(on_path, steps, t)).values[: d + 1].clamp(max=t - 1)  # BFS order = root first
    drafted = tree.depth.index_select(0, best)  # [1] accepted drafts
    emitted = torch.cat([tree.tokens[path[1:]], bonus]).scatter(0, drafted, bonus)
    return Verdict(torch.cat([drafted, emitted]), path, drafted + 1, emitted, bonus)
