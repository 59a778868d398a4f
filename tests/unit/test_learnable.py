import math
from collections import Counter

import pytest
import torch

from odc_bench.data.chain import BRANCH_PROBS, entropy_rate
from odc_bench.data.learnable import learnable_tokens, successor_table
from odc_bench.tools.learnable_curve import train_curve


def test_entropy_rate_is_the_entropy_of_one_row():
    assert entropy_rate((0.5, 0.5)) == pytest.approx(math.log(2))
    assert entropy_rate((1.0,)) == 0.0
    assert 0 < entropy_rate() < math.log(len(BRANCH_PROBS)) < math.log(2048) / 2


def test_successor_maps_are_permutations_with_distinct_successors():
    table = successor_table(3, 512)
    for k in range(table.shape[1]):
        assert sorted(table[:, k].tolist()) == list(range(512)), "every token has one way in per branch"
    assert all(len(set(row)) == table.shape[1] for row in table.tolist()), "a row's successors differ"


def test_empirical_conditional_entropy_matches_the_rate():
    # The plug-in estimate of H(next | current) from bigram counts of one long document.
    # With a small vocabulary every state is visited ~n/vocab times: its bias, about
    # (cells - rows) / (2n) = (4*64 - 64) / 4e5 < 0.001 nats, and its standard error,
    # sqrt(Var(-log p) / n) with Var(-log p) < 1, about 0.002 nats, are both far below the
    # 0.01 tolerance (5 standard errors).
    n, vocab = 200_000, 64
    ids = learnable_tokens(seed=7, sample_index=0, length=n + 1, vocab_size=vocab).tolist()
    pairs = Counter(zip(ids[:-1], ids[1:], strict=True))
    firsts = Counter(ids[:-1])
    h = -sum(c / n * math.log(c / firsts[a]) for (a, _), c in pairs.items())
    assert h == pytest.approx(entropy_rate(), abs=0.01)


def test_every_step_follows_the_table():
    table = successor_table(1, 2048).tolist()
    ids = learnable_tokens(1, 5, 1000, 2048).tolist()
    assert all(b in table[a] for a, b in zip(ids[:-1], ids[1:], strict=True))


def test_deterministic_in_its_arguments_only():
    a = learnable_tokens(1, 42, 300, 2048)
    assert a.dtype == torch.long and a.shape == (300,)
    assert torch.equal(a, learnable_tokens(1, 42, 300, 2048))
    assert torch.equal(a[:100], learnable_tokens(1, 42, 100, 2048)), "a shorter draw is a prefix"
    assert not torch.equal(a, learnable_tokens(1, 43, 300, 2048))
    assert not torch.equal(a, learnable_tokens(2, 42, 300, 2048))
    assert learnable_tokens(0, 0, 1, 2048).shape == (1,)
    assert learnable_tokens(0, 0, 0, 2048).shape == (0,)


@pytest.mark.slow
def test_a_few_dozen_steps_lower_the_loss():
    torch.set_num_threads(1)
    losses = train_curve(steps=40, docs=4, min_len=100, max_len=300)
    assert losses[0] == pytest.approx(math.log(2048), abs=0.3), "starts near a uniform guess"
    assert sum(losses[-5:]) / 5 < losses[0] - 0.3
