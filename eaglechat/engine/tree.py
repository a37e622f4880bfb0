"""Draft trees: which tokens the base model verifies in one forward, and how they hang together.

A tree is stored flat in breadth-first order (every parent before its children); node 0 is the root,
the last token already emitted but not yet in the base model's KV cache. Everything lives on the
model's device, in shapes fixed by the tree budget, so a decode step never waits for the host and can
be compiled or captured as a CUDA graph: a tree with fewer candidates than its budget is padded with
*invalid* nodes (children of the root that are never accepted).

EAGLE-2 dynamic tree (arXiv:2406.16858, section 4; SafeAILab/EAGLE `topK_genrate`): the drafter scores
candidates by *cumulative* draft log-probability along their path, expands the best `top_k` per level,
and `select_tree` keeps the `total_tokens` best candidates of the whole pool. Because a child's score
never exceeds its parent's, a stable sort by score (ties: shallower first) always keeps a connected
subtree.

EAGLE-1 static tree (arXiv:2401.15077): a fixed shape given as paths of child ranks (`STATIC_TREE_26`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch


@dataclass
class DraftTree:
    tokens: torch.Tensor  # [T] long, node 0 = root
    parents: torch.Tensor  # [T] long, -1 for the root
    depth: torch.Tensor  # [T] long, root 0
    ancestors: torch.Tensor  # [T, T] bool: ancestors[i, j] = j is i or an ancestor of i
    valid: torch.Tensor  # [T] bool: False for padding (and for nodes past the context limit)
    max_depth: int  # no node is deeper (fixed by the budget): bounds the accepted path
    max_children: int  # no node has more children (fixed by the budget)

    @property
    def size(self) -> int:
        return self.tokens.numel()

    def cut(self, room: int | torch.Tensor) -> "DraftTree":
        """Only the first `room` nodes stay valid (BFS order keeps them connected); the shape is unchanged.
        A device `room` (a step's context limit, [1]) is applied as a mask, without reading it back."""
        if isinstance(room, int) and room >= self.size:
            return self
        steps = torch.arange(self.size, device=self.tokens.device)
        return replace(self, valid=self.valid & (steps < room))


def ancestors_and_depth(parents: torch.Tensor, max_depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """parents [T] (root -1) -> (ancestor-or-self mask [T, T], depth [T]) in max_depth gathers, on the
    device: follow each node's parent pointer max_depth times (the root points at itself)."""
    t = parents.numel()
    up = parents.clamp(min=0)
    chain = [torch.arange(t, device=parents.device)]
    for _ in range(max_depth):
        chain.append(up[chain[-1]])
    hops = torch.stack(chain, dim=1)  # [T, max_depth + 1]: the node, its parent, grandparent, ...
    ancestors = torch.zeros(t, t, dtype=torch.bool, device=parents.device).scatter_(1, hops, True)
    depth = (hops[:, :max_depth] != 0).sum(dim=1)
    return ancestors, depth


def tree_from_parents(tokens: list[int], parents: list[int], device=None) -> DraftTree:
    """A tree given on the host in BFS order (parents[i] < i; parents[0] == -1): tests and static shapes."""
    n = len(tokens)
    depth = [0] * n
    children = [0] * n
    for i in range(1, n):
        p = parents[i]
        assert 0 <= p < i, "tree must be in BFS order with parents before children"
        depth[i] = depth[p] + 1
        children[p] += 1
    parents_t = torch.tensor(parents, dtype=torch.long, device=device)
    ancestors, depth_t = ancestors_and_depth(parents_t, max(depth))
    return DraftTree(
        tokens=torch.tensor(tokens, dtype=torch.long, device=device),
        parents=parents_t,
        depth=depth_t,
        ancestors=ancestors,
        valid=torch.ones(n, dtype=torch.bool, device=device),
        max_depth=max(depth),
        max_children=max(children),
    )


def as_root(root: int | torch.Tensor, device=None) -> torch.Tensor:
    """The root token as a one-element device tensor (the decode loop keeps it on the device)."""
    if isinstance(root, torch.Tensor):
        return root.reshape(1)
    return torch.full((1,), root, dtype=torch.long, device=device)


def root_only(root: int | torch.Tensor, device=None) -> DraftTree:
    """The degenerate tree of plain decoding: verify just the root, one token per forward."""
    root = as_root(root, device)
    device = root.device
    return DraftTree(
        tokens=root,
        parents=torch.full((1,), -1, dtype=torch.long, device=device),
        depth=torch.zeros(1, dtype=torch.long, device=device),
        ancestors=torch.ones(1, 1, dtype=torch.bool, device=device),
        valid=torch.ones(1, dtype=torch.bool, device=device),
        max_depth=0,
        max_children=0,
    )


def select_tree(
    root: int | torch.Tensor,
    cand_tokens: torch.Tensor,  # [P] candidate tokens in pool order (levels in order)
    cand_scores: torch.Tensor,  # [P] cumulative draft log-probs
    cand_parents: torch.Tensor,  # [P] pool index of each candidate's parent, -1 = root
    total_tokens: int,
    device=None,
    max_depth: int | None = None,
    max_children: int | None = None,
) -> DraftTree:
    """EAGLE-2 rerank: keep the `total_tokens` best candidates, as a tree in BFS order of
    total_tokens + 1 nodes (padded with invalid nodes when the pool is smaller). On the device."""
    root = as_root(root, cand_tokens.device)
    device = root.device
    n = min(total_tokens, cand_tokens.numel())
    # stable sort: on equal scores the earlier (shallower) candidate wins, so parents come first
    order = torch.sort(-cand_scores.float(), stable=True).indices[:n]
    keep = torch.sort(order).values  # pool order = BFS order
    pool_parents = cand_parents[keep]
    # a kept parent's slot in the tree: 1 + its rank among the kept pool indices
    slots = torch.searchsorted(keep, pool_parents.clamp(min=0)) + 1
    parents = torch.where(pool_parents < 0, 0, slots)
    pad = total_tokens - n
    tokens = torch.cat([root, cand_tokens[keep], root.expand(pad)])
    parents = torch.cat([torch.full((1,), -1, dtype=torch.long, device=device), parents,
                         torch.zeros(pad, dtype=torch.long, device=device)])
    valid = torch.ones(total_tokens + 1, dtype=torch.bool, device=device)
    if pad:
        valid[n + 1:] = False
    max_depth = n if max_depth is None else min(max_depth, n)
    ancestors, depth = ancestors_and_depth(parents, max_depth)
    return DraftTree(tokens, parents, depth, ancestors, valid, max_depth,
                     total_tokens if max_children is None else max_children)


# EAGLE-1's static tree for 7B models (`mc_sim_7b_63`): 25 drafted nodes, as paths of child ranks.
STATIC_TREE_26: list[tuple[int, ...]] = [
    (0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0),
    (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (2, 0, 0),
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 0, 0, 0), (0, 0, 0, 0, 1),
]
# the most nodes one level of the static tree expands (a level's children come from one head forward)
STATIC_TREE_EXPANDED = max(sum(1 for parent in {p[:-1] for p in STATIC_TREE_26 if len(p) == d + 1})
                           for d in range(max(map(len, STATIC_TREE_26))))


def static_levels(paths: list[tuple[int, ...]]) -> list[list[tuple[int, ...]]]:
    """Group static-tree paths by depth (level 1 first), each level sorted."""
    by_depth: dict[int, list[tuple[int, ...]]] = {}
    for p in paths:
        by_depth.setdefault(len(p), []).append(tuple(p))
    return [sorted(by_depth[d]) for d in sorted(by_depth)]


@dataclass
class StaticLevel:
    """One head forward of the static tree: the nodes that have children, and where their children go."""

    run_nodes: torch.Tensor  # [m] tree indices of the nodes run through the head (their token is the input)
    hidden_from: torch.Tensor  # [m] index into [h_last, outputs of earlier levels...]: each node's input feature
    visible: torch.Tensor  # [m, W] head-cache entries of this draft each node sees (its run ancestors)
    top: int  # children ranks needed: top-`top` of each run node's draft distribution
    pick: torch.Tensor  # [c] flat index into the [m, top] candidates for each child of this level, in tree order


@dataclass
class StaticPlan:
    """Everything about a static tree that does not depend on the drafted tokens, built once."""

    first_top: int
    first_pick: torch.Tensor  # [c1] ranks of the root's children
    levels: list[StaticLevel]
    tree: DraftTree  # tokens to be filled in


def static_plan(paths: list[tuple[int, ...]], device=None) -> StaticPlan:
    levels = static_levels(paths)
    index = {(): 0}
    parents = [-1]
    for p in (p for level in levels for p in level):
        index[p] = len(parents)
        parents.append(index[p[:-1]])
    first_top = 1 + max(p[0] for p in levels[0])
    run_slot: dict[tuple, int] = {}  # run node -> position among head-cache entries of this draft
    run_output: dict[tuple, int] = {}  # run node -> index into [h_last, level outputs...]
    plan_levels = []
    written = 0
    for level in levels[1:]:
        to_run = sorted({p[:-1] for p in level})
        m = len(to_run)
        visible = torch.zeros(m, written, dtype=torch.bool)
        for i, p in enumerate(to_run):
            for j in range(1, len(p)):
                visible[i, run_slot[p[:j]]] = True
        top = 1 + max(p[-1] for p in level)
        plan_levels.append(StaticLevel(
            run_nodes=torch.tensor([index[p] for p in to_run], device=device),
            hidden_from=torch.tensor([0 if len(p) == 1 else run_output[p[:-1]] for p in to_run], device=device),
            visible=visible.to(device),
            top=top,
            pick=torch.tensor([to_run.index(p[:-1]) * top + p[-1] for p in level], device=device),
        ))
        outputs_before = 1 + written
        for i, p in enumerate(to_run):
            run_slot[p] = written + i
            run_output[p] = outputs_before + i
        written += m
    tree = tree_from_parents([0] * len(parents), parents, device)
    return StaticPlan(first_top, torch.tensor([p[0] for p in levels[0]], device=device), plan_levels, tree)
