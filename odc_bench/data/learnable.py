"""Token ids from a seeded sparse Markov chain whose loss floor is known exactly.

The default token source (data/tokens.py) lets the loss fall, but nobody can say how far it
should fall. Here every document is a walk on one transition table per (seed, vocabulary):
each token has `len(BRANCH_PROBS)` distinct successors, taken with the probabilities
BRANCH_PROBS. Every row of the table has the same probabilities, so whatever the current
token, the next one carries exactly H(BRANCH_PROBS) nats of surprise; a model that has
learned the table reaches that cross-entropy and no model can go lower. `entropy_rate()`
(data/chain.py, beside BRANCH_PROBS) returns it (about 1.03 nats for the default, against
log(2048) = 7.62 for a uniform guess).

The successor maps are permutations of the vocabulary (the k-th successor of every token is
perm_k[token]), so every token has as many ways in as out: the uniform distribution is
stationary, documents starting from a uniform first token visit all tokens equally often, and
a short run sees the whole table. The first token of a document has no label
(models.decoder.packed_batch), so every labelled token sits at the floor, not just most of them.

Ids depend only on (seed, sample index, length, vocabulary), never on which rank draws them.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from odc_bench.data.chain import BRANCH_PROBS


def _no_repeats(perm: torch.Tensor, earlier: list[torch.Tensor], gen: torch.Generator) -> torch.Tensor:
    """Swap entries of perm until no token has it as a successor already given by `earlier`.

    Swapping two entries keeps perm a permutation; each round fixes most clashes and clashes
    are rare to begin with (about one per earlier permutation), so this ends in a few rounds.
    """
    perm = perm.clone()
    while True:
        clash = torch.zeros_like(perm, dtype=torch.bool)
        for e in earlier:
            clash |= perm == e
        bad = clash.nonzero().flatten()
        if bad.numel() == 0:
            return perm
        partners = torch.randint(perm.numel(), (bad.numel(),), generator=gen)
        for i, j in zip(bad.tolist(), partners.tolist(), strict=True):
            perm[i], perm[j] = perm[j].clone(), perm[i].clone()


@lru_cache(maxsize=8)
def successor_table(seed: int, vocab_size: int, branches: int = len(BRANCH_PROBS)) -> torch.Tensor:
    """[vocab_size, branches]: row t lists token t's successors, most likely first."""
    if vocab_size <= branches:
        raise ValueError(f"learnable tokens need a vocabulary larger than {branches}, got {vocab_size}")
    gen = torch.Generator().manual_seed((seed * 7_919 + vocab_size) % (2**63 - 1))
    perms: list[torch.Tensor] = []
    for _ in range(branches):
        perms.append(_no_repeats(torch.randperm(vocab_size, generator=gen), perms, gen))
    return torch.stack(perms, dim=1)


@lru_cache(maxsize=8)
def _rows(seed: int, vocab_size: int) -> list[list[int]]:
    # The walk is sequential, one lookup per token: Python lists index far faster than tensors.
    return successor_table(seed, vocab_size).tolist()


def learnable_tokens(seed: int, sample_index: int, length: int, vocab_size: int) -> torch.Tensor:
    """A document of `length` ids: a uniform first token, then a walk on the seed's table."""
    rows = _rows(seed, vocab_size)
    gen = torch.Generator().manual_seed((seed * 1_000_003 + sample_index) % (2**63 - 1))
    ids = [int(torch.randint(vocab_size, (1,), generator=gen))]
    # One uniform draw per step, mapped through the cumulative probabilities, so a shorter
    # document of the same sample is a prefix of a longer one.
    cum = torch.tensor(BRANCH_PROBS, dtype=torch.float64).cumsum(0)
    u = torch.rand(max(length - 1, 0), generator=gen, dtype=torch.float64)
    for c in torch.searchsorted(cum, u, right=True).clamp_(max=len(BRANCH_PROBS) - 1).tolist():
        ids.append(rows[ids[-1]][c])
    return torch.tensor(ids[:length], dtype=torch.long)
