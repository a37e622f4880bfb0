"""Counter-based random numbers for decode steps: a number is a hash of (seed, draw, index), the idea of
Philox (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), so no generator object
carries state from one draw to the next.

Why not torch.Generator: torch.compile refuses one inside a graph (dynamo cannot trace it as an
argument), and a CUDA graph replays the RNG offsets it captured. Here the whole state is one device
tensor [seed, draws so far] that each draw reads and advances in place: a compiled or captured step
draws fresh numbers at every replay, eager and compiled steps draw the same numbers, and nothing is read
back to the host.

The mixing function is lowbias32 (C. Wellons, "Prospecting for hash functions", 2018): two
multiply-xorshift rounds over 32 bits, computed in int64 with every product below 2^49, so no backend
meets signed overflow.
"""

from __future__ import annotations

import math

import torch

MASK = 0xFFFFFFFF


def _mul(x: torch.Tensor, c: int) -> torch.Tensor:
    """x * c mod 2^32 for 0 <= x < 2^32, in 16-bit halves of c (no int64 overflow)."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & MASK


def _mix(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul(x, 0x846CA68B)
    return x ^ (x >> 16)


class CounterRNG:
    """Uniform and exponential draws on `device` from one [2] int64 state tensor."""

    def __init__(self, device=None, seed: int = 0):
        self.state = torch.zeros(2, dtype=torch.long, device=device)  # [seed (32 bits), draws so far]
        self.manual_seed(seed)

    def manual_seed(self, seed: int) -> "CounterRNG":
        """Start the stream of `seed` (any int; 64-bit seeds are folded to 32 bits). In place, no upload."""
        self.state[0].fill_((seed ^ (seed >> 32)) & MASK)
        self.state[1].fill_(0)
        return self

    def _bits(self, n: int) -> torch.Tensor:
        """n fresh 32-bit values (as int64), advancing the draw counter by one."""
        seed, draw = self.state[0], self.state[1]
        key = _mix(seed ^ _mix((draw + 0x6A09E667) & MASK))
        self.state[1:].add_(1)
        index = torch.arange(n, device=self.state.device)
        return _mix(((_mix(index ^ key) + 0x9E3779B9) & MASK) ^ seed)

    def uniform(self, shape) -> torch.Tensor:
        """float32 in the open interval (0, 1), 24 random bits each."""
        shape = tuple(shape)
        bits = self._bits(math.prod(shape))
        return (((bits >> 8).float() + 0.5) * (1.0 / (1 << 24))).reshape(shape)

    def exponential(self, shape) -> torch.Tensor:
        """Exp(1) draws (-log of a uniform)."""
        return -torch.log(self.uniform(shape))
