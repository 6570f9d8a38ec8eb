"""Key/value states of token prefixes the model has already read, for reuse by later calls.

On a CPU a prompt token costs as much to read as a few generated ones, and an agent's prompts
repeat themselves: every episode of a harness version starts with the same system prompt, tool
hints and demonstrations, and each model call of an episode re-sends the whole conversation so
far. Attention is causal, so the key/value states of a token depend only on the tokens before it:
states computed for one sequence are exact for any other sequence with the same prefix.

Entries form a tree. An entry holds the full token sequence it stands for but only the states of
its own segment, ``tokens[start:]``; the states of ``tokens[:start]`` belong to its parent. An
episode's entry is then a small child of the harness prefix it grew from, and the prefix is
stored once however many episodes share it. Only leaves are evicted (least recently used first),
so a stored prefix never loses the states its children depend on.

The states are valid for one set of weights only. The owner calls ``validate(fingerprint)``
before each use with a value that changes whenever the weights do; a new value clears the cache.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch

LayerKV = list[tuple[torch.Tensor, torch.Tensor]]
"""Per decoder layer, keys and values of one sequence: each ``[heads, tokens, head_dim]``."""


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix; slice comparisons run in C, so this is a binary
    search over them rather than a Python loop over tokens."""
    hi = min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    lo = 0  # invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if a[:mid] == b[:mid] else (lo, mid)
    return lo


@dataclass(eq=False)
class Entry:
    tokens: tuple[int, ...]
    start: int  # states of tokens[:start] live in the parent
    kv: LayerKV  # own segment: [heads, len(tokens) - start, head_dim] per layer
    parent: Entry | None
    nbytes: int
    last_used: int = 0
    children: int = 0
    alive: bool = field(default=True)


@dataclass(frozen=True)
class ChainStates:
    """The states of a cached prefix, per layer on demand: ``[layer] -> (keys, values)``, each
    ``[heads, tokens, head_dim]``. A prefix stored over several entries is concatenated when a layer
    is read, so a decode batch gathers its rows' prefixes one layer at a time as it fills its past,
    never a whole copy of every row's prefix at once. ``chain``: (entry, first, last) token ranges,
    outermost first."""

    chain: tuple[tuple[Entry, int, int], ...]

    def __len__(self) -> int:
        return len(self.chain[0][0].kv)

    def __getitem__(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        ks = [e.kv[layer][0][:, a - e.start : b - e.start] for e, a, b in self.chain]
        vs = [e.kv[layer][1][:, a - e.start : b - e.start] for e, a, b in self.chain]
        return (ks[0], vs[0]) if len(ks) == 1 else (torch.cat(ks, 1), torch.cat(vs, 1))

    @property
    def tokens(self) -> int:
        return self.chain[-1][2]


class PrefixCache:
    """A bounded store of prefix states with longest-prefix lookup.

    ``max_bytes`` bounds the states held (keys and values of every layer); 0 disables the cache.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.entries: list[Entry] = []
        self.nbytes = 0
        self._clock = 0
        self._fingerprint: Hashable = None
        self.invalidations = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def validate(self, fingerprint: Hashable) -> None:
        """Drop every entry if the weights changed since the last call."""
        if fingerprint != self._fingerprint:
            if self.entries:
                self.invalidations += 1
            self.clear()
            self._fingerprint = fingerprint

    def clear(self) -> None:
        for e in self.entries:
            e.alive = False
        self.entries, self.nbytes = [], 0

    def match(self, tokens: Sequence[int], limit: int | None = None) -> tuple[Entry | None, int]:
        """The entry sharing the longest prefix with ``tokens`` and that length, at most ``limit``
        (callers pass ``len(tokens) - 1``: the last prompt token must be read to get its logits)."""
        limit = len(tokens) if limit is None else limit
        best, best_len = None, 0
        key = tuple(tokens[:limit])
        for e in self.entries:
            if len(e.tokens) <= best_len or (best_len < len(key) and e.tokens[best_len] != key[best_len]):
                continue  # cannot beat the best match so far
            n = common_prefix_len(e.tokens, key)
            if n > best_len:
                best, best_len = e, n
        if best is not None:
            self._touch(best)
        return best, best_len

    def states(self, entry: Entry, length: int) -> ChainStates:
        """Keys and values of ``entry.tokens[:length]``, gathered along the parent chain one layer at
        a time when read (``ChainStates``)."""
        chain: list[tuple[Entry, int, int]] = []  # (entry, first, last) token ranges, innermost first
        e, end = entry, length
        while e is not None and end > 0:
            if end > e.start:
                chain.append((e, e.start, end))
            end = min(end, e.start)
            e = e.parent
        chain.reverse()
        return ChainStates(tuple(chain))

    def pinned(self, entries: Sequence[Entry | None]) -> set[Entry]:
        """``entries`` and their ancestors: the states a call's rows read, which stay in memory while
        the call holds them whatever the cache evicts."""
        out: set[Entry] = set()
        for e in entries:
            while e is not None and e not in out:
                out.add(e)
                e = e.parent
        return out

    def insert(self, tokens: Sequence[int], kv: LayerKV, parent: Entry | None, start: int) -> Entry | None:
        """Store the states of ``tokens[start:]`` (``kv``), whose first ``start`` tokens are those of
        ``parent``. Returns the new entry, or None when it was not kept (empty, too big, or the
        parent was evicted meanwhile)."""
        if not self.enabled or len(tokens) <= start or (parent is not None and not parent.alive):
            return None
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        if nbytes > self.max_bytes:
            return None
        entry = Entry(tuple(tokens), start, [(k.contiguous(), v.contiguous()) for k, v in kv], parent, nbytes)
        if parent is not None:
            parent.children += 1
        self.entries.append(entry)
        self.nbytes += nbytes
        self._touch(entry)
        self._evict()
        return entry if entry.alive else None

    def _touch(self, entry: Entry) -> None:
        self._clock += 1
        e: Entry | None = entry
        while e is not None:  # using a child uses its ancestors
            e.last_used = self._clock
            e = e.parent

    def shrink_to(self, max_bytes: int, keep: set[Entry] | frozenset[Entry] = frozenset()) -> None:
        """Evict least recently used states, never those in ``keep``, until at most ``max_bytes`` stay
        or only kept ones are left (a decode batch needs the room); the bound ``max_bytes`` of later
        inserts is unchanged."""
        self._evict(max(0, max_bytes), keep)

    def _evict(self, limit: int | None = None, keep: set[Entry] | frozenset[Entry] = frozenset()) -> None:
        limit = self.max_bytes if limit is None else limit
        while self.nbytes > limit:
            leaves = [e for e in self.entries if e.children == 0 and e not in keep]
            if not leaves:
                return
            victim = min(leaves, key=lambda e: e.last_used)
            victim.alive = False
            self.entries.remove(victim)
            self.nbytes -= victim.nbytes
            if victim.parent is not None:
                victim.parent.children -= 1
