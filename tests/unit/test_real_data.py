import os

import numpy as np
import pytest

from odc_bench.data import real
from odc_bench.data.real import load_lengths
from odc_bench.errors import ConfigError, DataError
from odc_bench.plan.spec import resolve
from tests.helpers import run_cli, run_config
from tests.helpers.real_data import write_hf_dataset, write_jsonl, write_tokenizer


def test_jsonl_lines_may_be_counts_or_token_ids(tmp_path):
    src = write_jsonl(tmp_path / "a.jsonl", [120, [5, 6, 7], 2, 1, [9] * 40])
    # the 1-token sample has no label and is dropped
    assert load_lengths("jsonl", str(src)).tolist() == [120, 3, 2, 40]


def test_jsonl_objects_need_the_field(tmp_path):
    src = write_jsonl(tmp_path / "b.jsonl", [{"input_ids": [1, 2, 3], "id": 0}, {"input_ids": list(range(9))}])
    assert load_lengths("jsonl", str(src), field="input_ids").tolist() == [3, 9]
    with pytest.raises(DataError, match=r"line 1 is an object; set dataset.field .*id, input_ids"):
        load_lengths("jsonl", str(src), cache_dir=str(tmp_path / "c1"))
    with pytest.raises(DataError, match="line 1 has no key 'length'"):
        load_lengths("jsonl", str(src), field="length", cache_dir=str(tmp_path / "c2"))


def test_lengths_are_cached_next_to_the_source_and_reused(tmp_path, monkeypatch):
    src = write_jsonl(tmp_path / "c.jsonl", [10, 20, 30])
    assert load_lengths("jsonl", str(src)).tolist() == [10, 20, 30]
    caches = list(tmp_path.glob("c.jsonl.lengths-*.npy"))
    assert len(caches) == 1 and np.load(caches[0]).tolist() == [10, 20, 30]

    def no_reading(*_a, **_k):
        raise AssertionError("the cache should have been used")

    monkeypatch.setattr(real, "jsonl_lengths", no_reading)
    assert load_lengths("jsonl", str(src)).tolist() == [10, 20, 30]


def test_cache_is_invalidated_when_the_source_changes(tmp_path):
    src = write_jsonl(tmp_path / "d.jsonl", [10, 20, 30])
    load_lengths("jsonl", str(src))
    old = set(tmp_path.glob("d.jsonl.lengths-*.npy"))
    write_jsonl(src, [10, 20, 30, 40])
    os.utime(src, ns=(1, 1))  # a different mtime even on coarse-clock file systems
    assert load_lengths("jsonl", str(src)).tolist() == [10, 20, 30, 40]
    new = set(tmp_path.glob("d.jsonl.lengths-*.npy"))
    assert len(new) == 1 and new != old, "the stale cache is replaced"


def test_cache_dir_option_keeps_the_source_folder_clean(tmp_path):
    src = write_jsonl(tmp_path / "e.jsonl", [10, 20])
    load_lengths("jsonl", str(src), cache_dir=str(tmp_path / "cache"))
    assert not list(tmp_path.glob("*.npy")) and len(list((tmp_path / "cache").glob("*.npy"))) == 1


@pytest.mark.parametrize(("lines", "message"), [
    ("12\n{oops\n", r"line 2 is not valid JSON"),
    ("12\n\"text\"\n", r"line 2: expected a token count or a list of token ids, got str"),
    ("-3\n", r"line 1: negative token count -3"),
])
def test_corrupt_jsonl_names_the_line(tmp_path, lines, message):
    src = tmp_path / "bad.jsonl"
    src.write_text(lines)
    with pytest.raises(DataError, match=message):
        load_lengths("jsonl", str(src))
    assert not list(tmp_path.glob("*.npy")), "nothing cached from a bad file"


def test_missing_paths_are_data_errors(tmp_path):
    with pytest.raises(DataError, match="needs dataset.path"):
        load_lengths("jsonl", None)
    with pytest.raises(DataError, match="does not exist"):
        load_lengths("jsonl", str(tmp_path / "nope.jsonl"))
    with pytest.raises(DataError, match="has no sample of at least 2 tokens"):
        load_lengths("jsonl", str(write_jsonl(tmp_path / "tiny.jsonl", [0, 1])))


def test_hf_dataset_on_disk_is_tokenized_with_a_local_tokenizer(tmp_path):
    counts = [3, 17, 40, 8]
    data = write_hf_dataset(tmp_path / "ds", counts)
    tok = write_tokenizer(tmp_path / "tok")
    assert load_lengths("hf_disk", str(data), tokenizer=str(tok)).tolist() == counts  # one token per word
    assert len(list(tmp_path.glob("ds.lengths-*.npy"))) == 1, "cached beside the dataset directory"
    chat = write_hf_dataset(tmp_path / "chat", counts, chat=True)
    assert load_lengths("hf_disk", str(chat), text_field="messages",
                        tokenizer=str(tok / "tokenizer.json")).tolist() == counts


def test_hf_dataset_with_token_ids_needs_no_tokenizer(tmp_path):
    import datasets

    datasets.Dataset.from_dict({"input_ids": [[1] * 5, [2] * 12]}).save_to_disk(str(tmp_path / "ids"))
    assert load_lengths("hf_disk", str(tmp_path / "ids"), text_field="input_ids").tolist() == [5, 12]


def test_hf_errors_say_what_to_fix(tmp_path):
    data = write_hf_dataset(tmp_path / "ds", [3, 4])
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="has no tokenizer.json"):
        load_lengths("hf_disk", str(data), tokenizer=str(tmp_path / "empty"))
    tok = str(write_tokenizer(tmp_path / "tok"))
    with pytest.raises(DataError, match="has no column 'body'; set dataset.text_field to one of text"):
        load_lengths("hf_disk", str(data), text_field="body", tokenizer=tok)
    with pytest.raises(DataError, match="has no split 'test'; set dataset.split to one of train"):
        load_lengths("hf_disk", str(data), split="test", tokenizer=tok)
    with pytest.raises(DataError, match="cannot load .* with datasets.load_from_disk"):
        load_lengths("hf_disk", str(tmp_path / "empty"), tokenizer=tok)


def test_run_on_jsonl_scales_lengths_and_takes_the_longest_as_max_tokens(tmp_path):
    src = write_jsonl(tmp_path / "r.jsonl", [640 + 64 * i for i in range(40)])
    spec = resolve(run_config("dataset=jsonl", f"dataset.path={src}", "num_minibatches=3",
                                  "warmup_minibatches=0"))  # default length_scale 1/64
    assert spec.max_tokens == (640 + 64 * 39) // 64
    assert {n for mb in spec.minibatches for n in mb.lengths} <= {10 + i for i in range(40)}
    spec2 = resolve(run_config("dataset=jsonl", f"dataset.path={src}", "dataset.num_samples=8",
                                   "num_minibatches=3", "warmup_minibatches=0"))
    assert {n for mb in spec2.minibatches for n in mb.lengths} <= {10 + i for i in range(8)}


def test_missing_data_is_a_one_line_error_and_no_row(tmp_path, results_dir):
    with pytest.raises(ConfigError, match="dataset=jsonl needs dataset.path"):
        resolve(run_config("dataset=jsonl"))
    proc = run_cli("dataset=jsonl", f"dataset.path={tmp_path / 'missing.jsonl'}", f"results_dir={results_dir}")
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("odc_bench: error: dataset.path") and "does not exist" in lines[0]
    assert not (results_dir / "runs.csv").exists()
