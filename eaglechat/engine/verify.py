"""Acceptance: which drafted path the target model agrees with, plus the bonus token after it.

Greedy: follow the child whose token equals the target's argmax, as deep as it goes.
Sampling (SafeAILab/EAGLE `eagle/model/utils.py::evaluate_posterior`): at each node, try the distinct children in draft order; accept child
x with probability p(x) under the *processed* target distribution p; on rejection zero p(x) and
renormalise. When no child is accepted (or at a leaf), the bonus token is sampled from what is left.
Each emitted token is then distributed exactly as plain sampling from p (the draft is a point mass).
"""

from __future__ import annotations

import torch

from eaglechat.engine.protocol import GenerationParams
from eaglechat.engine.sampling import is_greedy, sample, target_probs, uniform
from eaglechat.engine.tree import DraftTree


def greedy_accept(tree: DraftTree, logits: torch.Tensor) -> tuple[list[int], int]:
    """-> (accepted path of tree nodes, root first; bonus token)."""
    predicted = logits.argmax(dim=-1).tolist()
    tokens = tree.tokens.tolist()
    node, path = 0, [0]
    while True:
        match = next((c for c in tree.children[node] if tokens[c] == predicted[node]), None)
        if match is None:
            return path, predicted[node]
        node = match
        path.append(node)


def sample_accept(
    tree: DraftTree, logits: torch.Tensor, params: GenerationParams, generator: torch.Generator | None
) -> tuple[list[int], int]:
    tokens = tree.tokens.tolist()
    node, path = 0, [0]
    while True:
        p = target_probs(logits[node], params)
        tried: set[int] = set()
        accepted = None
        for child in tree.children[node]:
            x = tokens[child]
            if x in tried:
                continue
            tried.add(x)
            px = float(p[x])
            if px > 0.0 and uniform(generator, p.device) < px:
                accepted = child
                break
            p[x] = 0.0
            total = p.sum()
            if total <= 0:  # float round-off: every remaining token had ~0 mass
                return path, x
            p = p / total
        if accepted is None:
            return path, sample(p, generator)
        node = accepted
        path.append(node)


def accept(tree, logits, params, generator):
    if is_greedy(params):
        return greedy_accept(tree, logits)
    return sample_accept(tree, logits, params, generator)
