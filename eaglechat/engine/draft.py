"""The drafter: runs the EAGLE head over verified features and grows a draft tree from it.

Invariant: the head's KV cache holds exactly `stable` entries, one per base-cache position, each
computed from a *verified* target feature (pair (f_t, x_{t+1}) at draft position t). Tree expansion
writes above `stable` and is forgotten when the next verified features are written over it.
"""

from __future__ import annotations

import torch

from eaglechat.engine.heads import EagleHead
from eaglechat.engine.protocol import TreeBudget
from eaglechat.engine.tree import STATIC_TREE_26, DraftTree, select_tree, static_levels, tree_from_parents


class Drafter:
    def __init__(self, head: EagleHead):
        self.head = head
        self.kv = head.new_kv()
        self.stable = 0
        self.h_last: torch.Tensor | None = None  # head output at the last verified position

    def truncate(self, length: int) -> None:
        self.stable = min(self.stable, length)
        self.h_last = None

    @torch.no_grad()
    def extend(self, features: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """Feed verified pairs: features [n, H] of positions stable..stable+n-1, next_tokens [n] (x_{t+1})."""
        n, start = features.shape[0], self.stable
        device = features.device
        positions = torch.arange(start, start + n, device=device)
        q = positions[:, None]
        k = torch.arange(start + n, device=device)[None, :]
        mask = (k <= q)[None, None]
        out = self.head(features[None].to(self.head.fc.weight.dtype), next_tokens[None], positions[None], mask, self.kv, start)
        self.stable += n
        self.h_last = out[0, -1]

    def _run_level(self, hidden, tokens, anc_rows, position: int):
        """Run the head on m tree nodes at one depth. anc_rows [m, W] marks the tree entries (written so
        far above `stable`) each node may see; the m nodes are written as the next m entries."""
        m, w = tokens.shape[0], anc_rows.shape[1]
        start = self.stable + w
        device = tokens.device
        mask = torch.zeros(m, start + m, dtype=torch.bool, device=device)
        mask[:, : self.stable] = True
        mask[:, self.stable:start] = anc_rows
        mask[:, start:] = torch.eye(m, dtype=torch.bool, device=device)
        positions = torch.full((1, m), position, device=device)
        out = self.head(hidden[None], tokens[None], positions, mask[None, None], self.kv, start)[0]
        own = torch.cat([anc_rows, torch.eye(m, dtype=torch.bool, device=device)], dim=1)
        return out, own

    def _log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.head.logits(hidden).float(), dim=-1)

    def _top_k(self, hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (log-probs, target token ids) of the k best draft tokens; EAGLE-3 heads with a reduced
        draft vocabulary score draft ids, mapped to target ids here (d + d2t[d])."""
        scores, ids = torch.topk(self._log_probs(hidden), k, dim=-1)
        d2t = getattr(self.head, "draft_to_target", None)
        return scores, (ids if d2t is None else d2t[ids])

    @torch.no_grad()
    def draft(self, root: int, budget: TreeBudget) -> DraftTree:
        assert self.h_last is not None, "extend() with verified features before drafting"
        if budget.kind == "static":
            return self._draft_static(root)
        return self._draft_dynamic(root, budget)

    def _draft_dynamic(self, root: int, budget: TreeBudget) -> DraftTree:
        """EAGLE-2: expand the top_k best nodes per level by cumulative log-prob, then rerank the pool."""
        k, device = budget.top_k, self.h_last.device
        scores, tokens = self._top_k(self.h_last, k)  # level 1: children of the root
        pool_tokens, pool_scores = [tokens], [scores]
        pool_parents = [torch.full((k,), -1, dtype=torch.long, device=device)]
        expand_idx = torch.arange(k, device=device)  # pool indices of the nodes expanded next
        hidden = self.h_last.expand(k, -1)  # a level-1 node's input feature is its parent's output
        anc = torch.zeros(k, 0, dtype=torch.bool, device=device)
        pool_size = k
        for level in range(1, budget.depth):
            out, anc = self._run_level(hidden, tokens, anc, self.stable + level - 1)
            child_scores, child_tokens = self._top_k(out, k)  # [k, k]
            cumulative = (child_scores + scores[:, None]).flatten()
            child_tokens = child_tokens.flatten()
            pool_tokens.append(child_tokens)
            pool_scores.append(cumulative)
            pool_parents.append(expand_idx.repeat_interleave(k))
            scores, best = torch.topk(cumulative, k)
            parent_row = best // k
            tokens, hidden, anc = child_tokens[best], out[parent_row], anc[parent_row]
            expand_idx = pool_size + best
            pool_size += k * k
        return select_tree(
            root, torch.cat(pool_tokens), torch.cat(pool_scores), torch.cat(pool_parents), budget.total_tokens, device
        )

    def _draft_static(self, root: int, paths=STATIC_TREE_26) -> DraftTree:
        """EAGLE-1: a fixed tree of child ranks; only nodes with children are run through the head."""
        levels = static_levels(paths)
        device = self.h_last.device
        index = {(): 0}
        tokens, parents = [root], [-1]
        ranks = self._top_k(self.h_last, 1 + max(p[0] for p in levels[0]))[1].tolist()
        for p in levels[0]:
            index[p] = len(tokens)
            tokens.append(ranks[p[0]])
            parents.append(0)
        # per expanded node: its output and its row over tree entries
        expanded: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        anc_of: dict[tuple, torch.Tensor] = {(): torch.zeros(0, dtype=torch.bool, device=device)}
        width = 0
        for depth, level in enumerate(levels[1:], start=1):
            to_run = sorted({p[:-1] for p in level})
            hid = torch.stack([self.h_last if len(p) == 1 else expanded[p[:-1]][0] for p in to_run])
            tok = torch.tensor([tokens[index[p]] for p in to_run], device=device)
            rows = torch.zeros(len(to_run), width, dtype=torch.bool, device=device)
            for i, p in enumerate(to_run):
                parent_row = anc_of[p[:-1]]
                rows[i, : parent_row.numel()] = parent_row
            out, own = self._run_level(hid, tok, rows, self.stable + depth - 1)
            width += len(to_run)
            child_ranks = self._top_k(out, 1 + max(p[-1] for p in level))[1].tolist()
            for i, p in enumerate(to_run):
                expanded[p] = (out[i], own[i])
                anc_of[p] = own[i]
            for p in level:
                index[p] = len(tokens)
                tokens.append(child_ranks[to_run.index(p[:-1])][p[-1]])
                parents.append(index[p[:-1]])
        return tree_from_parents(tokens, parents, device)
