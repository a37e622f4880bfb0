"""Draft trees: which tokens the base model verifies in one forward, and how they hang together.

A tree is stored flat in breadth-first order (every parent before its children); node 0 is the root,
the last token already emitted but not yet in the base model's KV cache.

EAGLE-2 dynamic tree (arXiv:2406.16858; SafeAILab/EAGLE `Model.topK_genrate`): the drafter scores candidates by *cumulative* draft
log-probability along their path, expands the best `top_k` per level, and `select_tree` keeps the
`total_tokens` best candidates of the whole pool. Because a child's score never exceeds its parent's,
a stable sort by score (ties: shallower first) always keeps a connected subtree.

EAGLE-1 static tree: a fixed shape given as paths of child ranks (`STATIC_TREE_26`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DraftTree:
    tokens: torch.Tensor  # [T] long, node 0 = root
    parents: list[int]  # [T], -1 for the root
    depth: torch.Tensor  # [T] long, root 0
    ancestors: torch.Tensor  # [T, T] bool: ancestors[i, j] = j is i or an ancestor of i
    children: list[list[int]]  # per node, children in order of draft preference

    @property
    def size(self) -> int:
        return len(self.parents)

    def path_to(self, node: int) -> list[int]:
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]


def tree_from_parents(tokens: list[int], parents: list[int], device=None) -> DraftTree:
    """Build the bookkeeping of a tree given in BFS order (parents[i] < i; parents[0] == -1)."""
    n = len(tokens)
    depth = [0] * n
    children: list[list[int]] = [[] for _ in range(n)]
    anc = torch.zeros(n, n, dtype=torch.bool)
    anc[0, 0] = True
    for i in range(1, n):
        p = parents[i]
        assert 0 <= p < i, "tree must be in BFS order with parents before children"
        depth[i] = depth[p] + 1
        children[p].append(i)
        anc[i] = anc[p]
        anc[i, i] = True
    return DraftTree(
        tokens=torch.tensor(tokens, dtype=torch.long, device=device),
        parents=list(parents),
        depth=torch.tensor(depth, dtype=torch.long, device=device),
        ancestors=anc.to(device),
        children=children,
    )


def root_only(root: int, device=None) -> DraftTree:
    """The degenerate tree of plain decoding: verify just the root, one token per forward."""
    return tree_from_parents([root], [-1], device)


def select_tree(
    root: int,
    cand_tokens: torch.Tensor,  # [P] candidate tokens in pool order (levels in order)
    cand_scores: torch.Tensor,  # [P] cumulative draft log-probs
    cand_parents: torch.Tensor,  # [P] pool index of each candidate's parent, -1 = root
    total_tokens: int,
    device=None,
) -> DraftTree:
    """EAGLE-2 rerank: keep the `total_tokens` best candidates, as a tree in BFS order."""
    n = min(total_tokens, cand_tokens.numel())
    # stable sort: on equal scores the earlier (shallower) candidate wins, so parents come first
    order = torch.sort(-cand_scores.float().cpu(), stable=True).indices[:n]
    keep = torch.sort(order).values.tolist()  # pool order = BFS order
    slot = {pool: i + 1 for i, pool in enumerate(keep)}
    tokens = [root] + cand_tokens.cpu()[keep].tolist()
    pool_parents = cand_parents.cpu()[keep].tolist()
    parents = [-1] + [0 if p < 0 else slot[p] for p in pool_parents]
    return tree_from_parents(tokens, parents, device)


# EAGLE-1's static tree for 7B models (`mc_sim_7b_63`): 25 drafted nodes, as paths of child ranks.
STATIC_TREE_26: list[tuple[int, ...]] = [
    (0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0),
    (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (2, 0, 0),
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 0, 0, 0), (0, 0, 0, 0, 1),
]


def static_levels(paths: list[tuple[int, ...]]) -> list[list[tuple[int, ...]]]:
    """Group static-tree paths by depth (level 1 first), each level sorted."""
    by_depth: dict[int, list[tuple[int, ...]]] = {}
    for p in paths:
        by_depth.setdefault(len(p), []).append(tuple(p))
    return [sorted(by_depth[d]) for d in sorted(by_depth)]

