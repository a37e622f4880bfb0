"""Per-step cost of the engine's bookkeeping on this machine: tree selection, verify mask, KV compaction.

    python scripts/microbench.py [--layers 32 --kv-heads 32 --head-dim 128 --context 2048]

Defaults give a Llama-2-7B-shaped cache (32 layers x 32 KV heads x 128, bf16). Medians and p90 of
repeated runs; these costs are paid once per verify step, on top of the draft and verify forwards.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from eaglechat.engine.cache import TreeKVCache
from eaglechat.engine.tree import select_tree


def timed(fn, repeats: int) -> tuple[float, float]:
    fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    samples.sort()
    return statistics.median(samples), samples[int(0.9 * (len(samples) - 1))]


def dynamic_pool(top_k: int, depth: int):
    """A pool shaped like EAGLE-2's: top_k root children, then top_k^2 candidates per expanded level."""
    g = torch.Generator().manual_seed(0)
    tokens, scores, parents = [], [], []
    level_scores = -torch.rand(top_k, generator=g)
    tokens.append(torch.randint(0, 32000, (top_k,), generator=g))
    scores.append(level_scores)
    parents.append(torch.full((top_k,), -1))
    expand, size = torch.arange(top_k), top_k
    for _ in range(depth - 1):
        cu = (level_scores[:, None] - torch.rand(top_k, top_k, generator=g)).flatten()
        tokens.append(torch.randint(0, 32000, (top_k * top_k,), generator=g))
        scores.append(cu)
        parents.append(expand.repeat_interleave(top_k))
        level_scores, best = torch.topk(cu, top_k)
        expand, size = size + best, size + top_k * top_k
    return torch.cat(tokens), torch.cat(scores), torch.cat(parents)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=32)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads; cache {args.layers} layers x {args.kv_heads} KV heads "
          f"x {args.head_dim}, bf16, context {args.context}")
    print(f"{'budget (total/depth/top_k)':24} {'tree select':>22} {'verify mask':>22} {'fresh mask (naive)':>22} {'KV keep':>22}")
    cache = TreeKVCache(args.layers, args.context + 128)
    mask_rows = torch.ones(1, 1, 128, args.context + 128, dtype=torch.bool)
    kv = torch.zeros(1, args.kv_heads, 1, args.head_dim, dtype=torch.bfloat16)
    for layer in cache.layers:
        layer.lazy_initialization(kv, kv)
    for total, depth, top_k in [(16, 4, 4), (32, 5, 8), (60, 6, 10)]:
        pool = dynamic_pool(top_k, depth)
        tree = select_tree(1, *pool, total)
        select = timed(lambda: select_tree(1, *pool, total), args.repeats)
        cur, size = args.context, tree.size

        def mask():  # as Decoder.forward does it: a view of a persistent all-True buffer
            allowed = mask_rows[:, :, :size, : cur + size]
            allowed[0, 0, :, cur:] = tree.ancestors
            allowed[0, 0, :, cur:] = True

        def fresh_mask():  # the naive way: allocate [T, context] every step
            allowed = torch.ones(1, 1, size, cur + size, dtype=torch.bool)
            allowed[0, 0, :, cur:] = tree.ancestors

        # the deepest path, as a verify step that accepted `depth` drafts would keep
        leaf = max(range(size), key=lambda i: int(tree.depth[i]))
        path = torch.nonzero(tree.ancestors[leaf]).flatten()

        def keep():
            cache.commit(cur + size)
            cache.position.fill_(cur + size)
            cache.keep_path(path, torch.full((1,), path.numel()), size)
            cache.commit(cur + path.numel())

        m, f, k = timed(mask, args.repeats), timed(fresh_mask, args.repeats), timed(keep, args.repeats)
        fmt = lambda t: f"{t[0]:6.2f} ms (p90 {t[1]:5.2f})"  # noqa: E731
        print(f"{f'{total}/{depth}/{top_k} (T={size})':24} {fmt(select):>22} {fmt(m):>22} {fmt(f):>22} {fmt(k):>22}  path {path.numel()}")
    print(f"cache memory: {cache.memory_bytes() / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
