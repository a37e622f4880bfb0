"""The drafter: runs the EAGLE head over verified features and grows a draft tree from it.

Invariant: the head's KV cache holds exactly `stable` entries, one per base-cache position, each
computed from a *verified* target feature (pair (f_t, x_{t+1}) at draft position t). Tree expansion
writes above `stable` and is forgotten when the next verified features are written over it.

Like the base cache, the count lives twice: `stable` on the host (window sizes, prefix reuse) and
`position` on the device (where entries go, RoPE positions), so drafting never reads the device.
In static mode (compiled steps) attention sees a window of `window` entries fixed by the host before
the step (engine/cache.py `bucket`): fixed shapes per budget and bucket. `h_last` is one buffer written in
place, so a compiled step reads and writes it at a fixed address.

Plain steps under speculate="auto" do not run the head; the verified features they leave (row i: base
position `stable + i`, `behind` rows on the host) wait until the next speculative step, when `catch_up`
reads them in head forwards of at most `chunk` rows (a prefill chunk). The head's cache then holds what it
would hold had it read every position one step at a time; nothing of it crosses to the host. Where they
wait depends on how steps run:
- eager steps: `pending`, references to the step's own output tensors (the feature, the token after it),
  and the prompt's chunks under speculate="auto" too: a plain step runs exactly the ops of plain decoding,
  and a reply that never speculates never runs the head. At most `PENDING_ROWS` rows wait (memory: that
  many features); past it, the head reads them at once.
- captured or compiled steps (static output buffers, overwritten by the next replay): the step writes its
  feature into `backlog` (`remember`, inside the one graph), read when a speculative step comes or when it
  is full (`BACKLOG_ROWS`).
"""

from __future__ import annotations

import torch

from eaglechat.engine.cache import bucket
from eaglechat.engine.heads import EagleHead
from eaglechat.engine.protocol import PREFILL_CHUNK, TreeBudget
from eaglechat.engine.tree import STATIC_TREE_26, DraftTree, StaticPlan, as_root, select_tree, static_plan

BACKLOG_ROWS = 64  # compiled plain steps' features kept on the device before the drafter reads them
PENDING_ROWS = 2048  # eager: rows waiting at most (speculate="auto" re-probes within 1024 steps, + a prompt)


class Drafter:
    def __init__(self, head: EagleHead, capacity: int = 256, chunk: int = PREFILL_CHUNK):
        self.head = head
        self.chunk = chunk  # rows a catch-up reads per head forward at most
        self.kv = head.new_kv(capacity=capacity)
        self.device = self.kv.k.device
        self.stable = 0
        self.position = torch.zeros(1, dtype=torch.long, device=self.device)
        self.static = False
        self.window = 0  # static mode: head-cache entries attention sees (set by `open`)
        self.h_last: torch.Tensor | None = None  # head output at the last verified position (one buffer)
        self.ready = False  # h_last holds the output at position stable - 1
        self.backlog: torch.Tensor | None = None  # [BACKLOG_ROWS, F] verified features not read yet
        self.backlog_tokens = torch.zeros(BACKLOG_ROWS, dtype=torch.long, device=self.device)  # the token after each
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []  # eager: (features [r, F], next tokens [r])
        self.behind = 0  # rows waiting (backlog or pending): base positions stable .. stable + behind - 1
        self._plans = {}

    def prepare(self, budget: TreeBudget, capacity: int) -> None:
        """Once per turn: head-cache room for `capacity` entries, and the static tree's plan."""
        self.kv.reserve(capacity)
        if budget.kind == "static":
            self._static_plan(STATIC_TREE_26)

    def _static_plan(self, paths):
        plan = self._plans.get(id(paths))
        if plan is None:
            plan = self._plans[id(paths)] = static_plan(paths, self.device)
        return plan

    def buffers(self) -> list[torch.Tensor]:
        """The tensors a compiled step mutates in place (to be marked as static addresses)."""
        optional = [t for t in (self.h_last, self.backlog) if t is not None]
        return [self.kv.k, self.kv.v, self.position, self.backlog_tokens] + optional

    def truncate(self, length: int) -> None:
        kept = max(0, min(self.stable, length))
        self.behind = min(self.behind, length - kept) if kept == self.stable else 0
        self.pending = first_rows(self.pending, self.behind)
        self.stable = kept
        self.position.fill_(self.stable)
        self.ready = False

    @property
    def covered(self) -> int:
        """Base positions whose features the drafter holds or can catch up on."""
        return self.stable + self.behind

    def remember(self, feature: torch.Tensor, next_token: torch.Tensor, row: torch.Tensor) -> None:
        """Device side, inside a plain step: keep the verified feature [1, F] of base position
        `stable + row` (row: device [1]) and the token after it ([1]) for a later catch-up."""
        self.backlog.index_copy_(0, row, feature.to(self.backlog.dtype))
        self.backlog_tokens.index_copy_(0, row, next_token)

    def keep(self, features: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """Host side, eager: verified features [r, F] of the next `r` base positions and the token after
        each ([r], on the device) wait for a catch-up; no device work (the head reads them at once only
        past `PENDING_ROWS`)."""
        if self.behind + features.shape[0] > PENDING_ROWS:
            self.catch_up()
        self.pending.append((features, next_tokens))
        self.behind += features.shape[0]

    def catch_up(self) -> None:
        """Host side: read the `behind` waiting rows, in head forwards of at most `chunk` rows."""
        rows, self.behind = self.behind, 0
        if not rows:
            return
        if self.pending:
            # one segment is read as it is; several are joined once
            features, tokens = (torch.cat(part) if len(part) > 1 else part[0] for part in zip(*self.pending))
            self.pending = []
        else:
            features, tokens = self.backlog[:rows], self.backlog_tokens[:rows]
        for start in range(0, rows, self.chunk):
            self.extend(features[start:start + self.chunk], tokens[start:start + self.chunk])

    def open(self, need: int) -> None:
        """Host side, before a compiled step: its window holds at least `need` entries (the verified ones
        plus what the step writes above them)."""
        self.window = bucket(need, self.kv.capacity)

    def _window(self, entries: int) -> int:
        """Head-cache entries attention sees when `entries` are written above `stable`."""
        return self.window if self.static else self.stable + entries

    @torch.no_grad()
    def extend(self, features: torch.Tensor, next_tokens: torch.Tensor, count: torch.Tensor | None = None,
               n: int | None = None) -> None:
        """Feed verified pairs: features [r, H] of positions stable..stable+r-1, next_tokens [r] (x_{t+1}).
        A verify step passes its padded path (r = max_depth + 1) with `count` (device [1]) and `n` (host)
        valid rows: the padding is written above the new `stable` and overwritten later."""
        r = features.shape[0]
        if self.backlog is None:  # once, when the first features arrive (their width and dtype)
            self.backlog = features.new_zeros(BACKLOG_ROWS, features.shape[1])
        count = torch.full((1,), r, device=self.device) if count is None else count
        self.extend_device(features, next_tokens, count, window=self.stable + r)  # eager: the exact window
        self.commit(r if n is None else n)

    def commit(self, n: int) -> None:
        """Host side: n verified entries were written (the device already holds them)."""
        self.stable += n
        self.ready = True

    def extend_device(self, features, next_tokens, count, window: int | None = None) -> None:
        """Device work of `extend` (inside a step: window None): write the rows, advance the device position
        by `count`, h_last = the head's output at the last valid row (in place)."""
        r = features.shape[0]
        slots = torch.arange(window or self._window(r), device=self.device)
        queries = self.position + torch.arange(r, device=self.device)
        mask = (slots[None, :] <= queries[:, None])[None, None]
        out = self.head(features[None].to(self.head.fc.weight.dtype), next_tokens[None], queries[None], mask,
                        self.kv, self.position)[0]
        self.position += count
        last = out.index_select(0, count - 1)[0]
        if self.h_last is None or self.h_last.shape != last.shape:
            self.h_last = last.clone()  # once: later steps write into the same buffer
        else:
            self.h_last.copy_(last)

    def _run_level(self, hidden, tokens, visible, level: int):
        """Run the head on m tree nodes at one depth. visible [m, W] marks the tree entries (written so far
        above `stable`) each node may see; the m nodes are written as the next m entries."""
        m, w = tokens.shape[0], visible.shape[1]
        device = tokens.device
        own = torch.cat([visible, torch.eye(m, dtype=torch.bool, device=device)], dim=1)  # [m, W + m]
        rel = torch.arange(self._window(w + m), device=device) - self.position  # key slot - stable
        in_tree = (rel >= 0) & (rel < w + m)
        mask = (rel < 0)[None, :] | (own.index_select(1, rel.clamp(0, w + m - 1)) & in_tree[None, :])
        positions = (self.position + (level - 1)).expand(1, m)
        out = self.head(hidden[None], tokens[None], positions, mask[None, None], self.kv, self.position + w)[0]
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
    def draft(self, root: int | torch.Tensor, budget: TreeBudget) -> DraftTree:
        assert self.ready, "extend() with verified features before drafting"
        root = as_root(root, self.device)
        if budget.kind == "static":
            return self._draft_static(root, self._static_plan(STATIC_TREE_26))
        return self._draft_dynamic(root, budget)

    def _draft_dynamic(self, root: torch.Tensor, budget: TreeBudget) -> DraftTree:
        """EAGLE-2: expand the draft_top_k best nodes per level by cumulative log-prob, then rerank the pool."""
        k, device = budget.draft_top_k, self.device
        scores, tokens = self._top_k(self.h_last, k)  # level 1: children of the root
        pool_tokens, pool_scores = [tokens], [scores]
        pool_parents = [torch.full((k,), -1, dtype=torch.long, device=device)]
        expand_idx = torch.arange(k, device=device)  # pool indices of the nodes expanded next
        hidden = self.h_last.expand(k, -1)  # a level-1 node's input feature is its parent's output
        visible = torch.zeros(k, 0, dtype=torch.bool, device=device)
        pool_size = k
        for level in range(1, budget.depth):
            out, visible = self._run_level(hidden, tokens, visible, level)
            child_scores, child_tokens = self._top_k(out, k)  # [k, k]
            cumulative = (child_scores + scores[:, None]).flatten()
            child_tokens = child_tokens.flatten()
            pool_tokens.append(child_tokens)
            pool_scores.append(cumulative)
            pool_parents.append(expand_idx[:, None].expand(k, k).flatten())  # each parent k times
            scores, best = torch.topk(cumulative, k)
            parent_row = best // k
            tokens, hidden, visible = child_tokens[best], out[parent_row], visible[parent_row]
            expand_idx = pool_size + best
            pool_size += k * k
        return select_tree(root, torch.cat(pool_tokens), torch.cat(pool_scores), torch.cat(pool_parents),
                           budget.total_tokens, max_depth=budget.depth, max_children=k)

    def _draft_static(self, root: torch.Tensor, plan: StaticPlan) -> DraftTree:
        """EAGLE-1: a fixed tree of child ranks; only nodes with children are run through the head."""
        tokens = [root, self._top_k(self.h_last, plan.first_top)[1].index_select(0, plan.first_pick)]
        outputs = [self.h_last[None]]  # input features: h_last, then each level's outputs
        for depth, level in enumerate(plan.levels, start=1):
            so_far = torch.cat(tokens)
            hidden = torch.cat(outputs).index_select(0, level.hidden_from)
            out, _ = self._run_level(hidden, so_far.index_select(0, level.run_nodes), level.visible, depth)
            ranks = self._top_k(out, level.top)[1].flatten()
            tokens.append(ranks.index_select(0, level.pick))
            outputs.append(out)
        tree = plan.tree
        return DraftTree(torch.cat(tokens), tree.parents, tree.depth, tree.ancestors, tree.valid,
                         tree.max_depth, tree.max_children)


def first_rows(segments: list[tuple[torch.Tensor, torch.Tensor]], n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first `n` rows of (features, tokens) segments (views, no copy)."""
    kept = []
    for features, tokens in segments:
        if n <= 0:
            break
        kept.append((features[:n], tokens[:n]) if features.shape[0] > n else (features, tokens))
        n -= features.shape[0]
    return kept
