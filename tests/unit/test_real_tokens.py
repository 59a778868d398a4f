"""dataset.tokens=data: runs train on the token ids a real source gives, checked against the vocabulary."""

import json

import numpy as np
import pytest

from odc_bench.data import real
from odc_bench.data.real import write_pending_caches
from odc_bench.data.tokens import token_source
from odc_bench.errors import DataError
from odc_bench.plan.spec import resolve
from odc_bench.record.metrics import events_frame, minibatch_losses
from odc_bench.run.local import run_local
from tests.helpers import run_config
from tests.helpers.real_data import write_jsonl

SMALL = ("model=tiny", "model.num_layers=1", "world_size=2", "minibatch_size=4", "num_minibatches=8",
         "warmup_minibatches=0", "optim.lr=1e-2")


@pytest.mark.slow
def test_a_repeated_sequence_of_real_ids_trains_far_below_synthetic_tokens(tmp_path):
    # One sequence on every line, a cycle of 4 ids: a model that trains on these ids learns the
    # 4 transitions within a few steps, while the synthetic ids of the same lengths (progressions
    # with 10% random tokens) stay near a uniform guess over the vocabulary, log(2048) = 7.6 nats.
    sequence = np.random.default_rng(0).choice(2048, size=4, replace=False).tolist() * 12
    src = write_jsonl(tmp_path / "repeat.jsonl", [sequence] * 32)
    data = resolve(run_config(*SMALL, "dataset=jsonl", f"dataset.path={src}"))
    synthetic = resolve(run_config(*SMALL, "dataset=jsonl", f"dataset.path={src}", "dataset.tokens=synthetic"))
    assert data.config.dataset.tokens == "data", "ids given: the default trains on them"
    write_pending_caches()  # as the job does: the ranks read the ids from the cache
    losses = {}
    for name, spec in (("data", data), ("synthetic", synthetic)):
        labelled = [mb.labelled_tokens for mb in spec.minibatches]
        losses[name] = minibatch_losses(events_frame(run_local(spec)), labelled)
    assert losses["data"][0] == pytest.approx(losses["synthetic"][0], abs=1.0), "both start from a guess"
    assert losses["data"][-1] < 0.25 * losses["synthetic"][-1], losses


def test_counts_keep_synthetic_tokens_and_tokens_data_needs_ids(tmp_path):
    counts = write_jsonl(tmp_path / "counts.jsonl", [40] * 16)
    assert resolve(run_config(*SMALL, "dataset=jsonl", f"dataset.path={counts}")).config.dataset.tokens == "synthetic"
    with pytest.raises(DataError, match=r"counts.jsonl gives token counts, not ids, so dataset.tokens=data"):
        resolve(run_config(*SMALL, "dataset=jsonl", f"dataset.path={counts}", "dataset.tokens=data"))
    mixed = write_jsonl(tmp_path / "mixed.jsonl", [40, list(range(40))] * 8)
    assert resolve(run_config(*SMALL, "dataset=jsonl", f"dataset.path={mixed}")).config.dataset.tokens == "synthetic"
    ids = write_jsonl(tmp_path / "ids.jsonl", [list(range(40))] * 16)
    scaled = resolve(run_config(*SMALL, "dataset=jsonl", f"dataset.path={ids}", "dataset.length_scale=0.5"))
    assert scaled.config.dataset.tokens == "synthetic", "scaled lengths are no longer the ids' own"


@pytest.mark.parametrize(("line", "message"), [
    ([5, 2048, 7], r"line 3: token id 2048 at position 1 is outside the model's vocabulary \(model.vocab_size=2048"),
    ([5, 6, 10**6], r"line 3: token id 1000000 at position 2 is outside"),
    ([1, 2, 2**31], r"line 3: token id 2147483648 at position 2 is beyond any vocabulary"),
    ([1, -2], r"line 3: token ids must be integers >= 0, got -2 at position 1"),
    ([1, 2.0], r"line 3: token ids must be integers >= 0, got 2.0 at position 1"),
    ([1, False], r"line 3: token ids must be integers >= 0, got False at position 1"),
    ([1, [2, 3]], r"line 3: token ids must be integers >= 0, got \[2, 3\] at position 1"),
    (["1", "2"], r"line 3: token ids must be integers >= 0, got '1' at position 0"),
    ("12", r"line 3: expected a token count or a list of token ids, got text"),
])
def test_bad_ids_name_the_line_and_cache_nothing(tmp_path, line, message):
    src = tmp_path / "bad.jsonl"
    # a blank line before the bad one: the line number is the file's, not the sample's
    src.write_text(f"{json.dumps(list(range(8)))}\n\n{json.dumps(line)}\n" + f"{json.dumps(list(range(8)))}\n" * 8)
    with pytest.raises(DataError, match=message):
        resolve(run_config(*SMALL, "dataset=jsonl", f"dataset.path={src}", "dataset.tokens=data"))
    assert not list(tmp_path.glob("*.npy")), "nothing cached from a refused file"


def test_an_empty_list_is_a_sample_with_nothing_to_learn(tmp_path):
    src = write_jsonl(tmp_path / "e.jsonl", [[], [3], *([list(range(8))] * 8)])
    spec = resolve(run_config(*SMALL, "dataset=jsonl", f"dataset.path={src}", "num_minibatches=1"))
    assert spec.config.dataset.tokens == "data" and {n for mb in spec.minibatches for n in mb.lengths} == {8}


def test_the_simulator_resolves_tokens_alike_but_embeds_no_ids(tmp_path):
    src = write_jsonl(tmp_path / "big.jsonl", [[1, 5000, 2]] * 16)
    sim = resolve(run_config(*SMALL, "backend=sim", "dataset=jsonl", f"dataset.path={src}"))
    assert sim.config.dataset.tokens == "data", "same key as a real run's; the vocabulary is not its concern"


def test_hf_disk_ids_columns_and_tokenized_text_are_trained_on(tmp_path):
    import datasets

    from tests.helpers.real_data import write_hf_dataset, write_tokenizer

    datasets.Dataset.from_dict({"input_ids": [[3, 4, 5, 6]] * 16}).save_to_disk(str(tmp_path / "ids"))
    spec = resolve(run_config(*SMALL, "dataset=hf_disk", f"dataset.path={tmp_path / 'ids'}",
                              "dataset.text_field=input_ids", "num_minibatches=1"))
    assert spec.config.dataset.tokens == "data"
    assert token_source(spec.config.dataset)(0, 5, 4, 2048).tolist() == [3, 4, 5, 6]
    data, tok = write_hf_dataset(tmp_path / "ds", [6] * 16), write_tokenizer(tmp_path / "tok")
    text = resolve(run_config(*SMALL, "dataset=hf_disk", f"dataset.path={data}", f"dataset.tokenizer={tok}",
                              "num_minibatches=1"))
    ids = token_source(text.config.dataset)(0, 0, 6, 2048)
    assert text.config.dataset.tokens == "data" and ids.numel() == 6 and int(ids.max()) < 16, "word-level ids"


def test_only_samples_a_run_can_draw_are_checked_against_the_vocabulary(tmp_path):
    # an out-of-range id in a 1-token sample (dropped) or past dataset.num_samples is never trained on
    src = write_jsonl(tmp_path / "tail.jsonl", [[4000], *([list(range(8))] * 8), [1, 4000]])
    spec = resolve(run_config(*SMALL, "dataset=jsonl", f"dataset.path={src}", "dataset.num_samples=8",
                              "num_minibatches=1"))
    assert spec.config.dataset.tokens == "data"
    with pytest.raises(DataError, match=r"tail.jsonl line 10: token id 4000 at position 1 is outside"):
        resolve(run_config(*SMALL, "dataset=jsonl", f"dataset.path={src}", "num_minibatches=1"))


def test_a_lengths_cache_without_ids_is_not_taken_for_a_source_without_ids(tmp_path):
    src = write_jsonl(tmp_path / "old.jsonl", [list(range(8))] * 8)
    pool = real.load_pool("jsonl", str(src))
    write_pending_caches()
    next(tmp_path.glob("old.jsonl.ids-*.npy")).unlink()  # as a cache from before ids were kept
    assert real.load_pool("jsonl", str(src)).has_ids and pool.has_ids
