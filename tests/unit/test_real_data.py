import bz2
import gzip
import lzma
import os
import re
import resource
import signal

import numpy as np
import pytest

from odc_bench.data import real
from odc_bench.data.real import load_lengths, load_pool, write_pending_caches
from odc_bench.errors import ConfigError, DataError
from odc_bench.jobs.train import describe_lengths
from odc_bench.plan.spec import resolve
from odc_bench.results.table import read_table
from tests.helpers import odc_bench, run_config
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


def test_a_field_that_names_nothing_in_a_file_of_counts_or_ids_is_refused(tmp_path):
    """Before, dataset.field on a file of bare counts was ignored without a word."""
    src = write_jsonl(tmp_path / "d.jsonl", [120, 7, {"n": 5}])
    with pytest.raises(DataError, match=r"line 1 is a token count, not an object holding the key dataset.field "
                                        r"\('n'\); unset dataset.field"):
        load_lengths("jsonl", str(src), field="n")
    ids = write_jsonl(tmp_path / "e.jsonl", [[1, 2, 3]])
    with pytest.raises(DataError, match="line 1 is a list of token ids, not an object"):
        load_lengths("jsonl", str(ids), field="input_ids")


def test_a_cache_of_a_read_the_reader_now_refuses_is_not_served(tmp_path, monkeypatch):
    """Before, a lengths cache written while dataset.field on a file of bare counts was ignored
    went on being read, so the refusal above never came for that file."""
    src = write_jsonl(tmp_path / "d.jsonl", [120, 7, 5])
    reader = real.jsonl_samples
    with monkeypatch.context() as old:  # the reader and cache of before the refusal
        old.setattr(real, "CACHE_VERSION", 1)
        old.setattr(real, "jsonl_samples", lambda path, field: reader(path, None))
        assert load_lengths("jsonl", str(src), field="n").tolist() == [120, 7, 5]
        write_pending_caches()
    assert list(tmp_path.glob("d.jsonl.lengths-*.npy"))
    with pytest.raises(DataError, match="line 1 is a token count, not an object holding the key dataset.field"):
        load_lengths("jsonl", str(src), field="n")


def test_lengths_are_cached_next_to_the_source_once_accepted_and_reused(tmp_path, monkeypatch):
    src = write_jsonl(tmp_path / "c.jsonl", [10, 20, 30])
    assert load_lengths("jsonl", str(src)).tolist() == [10, 20, 30]
    assert not list(tmp_path.glob("*.npy")), "nothing beside the data before the run is accepted"
    write_pending_caches()
    caches = list(tmp_path.glob("c.jsonl.lengths-*.npy"))
    assert len(caches) == 1 and np.load(caches[0]).tolist() == [10, 20, 30]

    def no_reading(*_a, **_k):
        raise AssertionError("the cache should have been used")

    monkeypatch.setattr(real, "jsonl_samples", no_reading)
    assert load_lengths("jsonl", str(src)).tolist() == [10, 20, 30]


def test_a_cache_that_cannot_be_written_says_why(tmp_path, monkeypatch):
    """numpy writes a real file with tofile(), whose short write raised an OSError without its
    errno: the refusal read "cannot write the lengths cache ... (None)" on a full disk. Here the
    process's file size limit cuts the write short instead."""
    monkeypatch.setattr(real, "_pending", {})
    src = write_jsonl(tmp_path / "big.jsonl", list(range(2, 3000)))
    load_lengths("jsonl", str(src))
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of the signal's kill
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, limit[1]))
        with pytest.raises(DataError) as refused:
            write_pending_caches()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        signal.signal(signal.SIGXFSZ, handler)
    assert re.fullmatch(r"cannot write the lengths cache \S+/big\.jsonl\.lengths-\w+\.npy: File too large; set "
                        r"dataset\.cache_dir to a writable directory", str(refused.value)), str(refused.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.jsonl"], "no cache, whole or in part"


def test_cache_is_invalidated_when_the_source_changes(tmp_path):
    src = write_jsonl(tmp_path / "d.jsonl", [10, 20, 30])
    load_lengths("jsonl", str(src))
    write_pending_caches()
    old = set(tmp_path.glob("d.jsonl.lengths-*.npy"))
    write_jsonl(src, [10, 20, 30, 40])
    os.utime(src, ns=(1, 1))  # a different mtime even on coarse-clock file systems
    assert load_lengths("jsonl", str(src)).tolist() == [10, 20, 30, 40]
    write_pending_caches()
    new = set(tmp_path.glob("d.jsonl.lengths-*.npy"))
    assert len(new) == 1 and new != old, "the stale cache is replaced"


def test_cache_dir_option_keeps_the_source_folder_clean(tmp_path):
    src = write_jsonl(tmp_path / "e.jsonl", [10, 20])
    load_lengths("jsonl", str(src), cache_dir=str(tmp_path / "cache"))
    write_pending_caches()
    assert not list(tmp_path.glob("*.npy")) and len(list((tmp_path / "cache").glob("*.npy"))) == 2


@pytest.mark.parametrize(("lines", "message"), [
    ("12\n{oops\n", r"line 2 is not valid JSON"),
    ("12\n\"text\"\n", r"line 2: expected a token count or a list of token ids, got text"),
    ("12\n[3, -1]\n", r"line 2: token ids must be integers >= 0, got -1 at position 1"),
    ("12\n[3, true]\n", r"line 2: token ids must be integers >= 0, got True at position 1"),
    ("-3\n", r"line 1: negative token count -3"),
    # Named as the file spells them, not by Python's type names (NoneType, True, dict).
    ("12\nnull\n", r"line 2: expected a token count or a list of token ids, got null$"),
    ("12\ntrue\n", r"line 2: expected a token count or a list of token ids, got true$"),
    ("12\n512.5\n", r"line 2: a token count is a whole number, got 512.5$"),
    ("12\nNaN\n", r"line 2: a token count is a whole number, got nan$"),
    # Before, beyond int64 a traceback (OverflowError); a float's, too.
    ("12\n99999999999999999999999\n", r"line 2: a token count of 99999999999999999999999 is beyond any sequence"),
    ("12\n1e30\n", r"line 2: a token count of 1000000000000000019884624838656 is beyond any sequence"),
    ("12\n2147483648\n", r"line 2: a token count of 2147483648 is beyond any sequence a model takes \(counts are "
                          r"below 2147483648\)"),
])
def test_corrupt_jsonl_names_the_line(tmp_path, lines, message):
    src = tmp_path / "bad.jsonl"
    src.write_text(lines)
    with pytest.raises(DataError, match=message):
        load_lengths("jsonl", str(src))
    assert not list(tmp_path.glob("*.npy")), "nothing cached from a bad file"


@pytest.mark.parametrize("counts", [np.array([12, 2**63 + 5], dtype=np.uint64), np.array([12, -4, 40])])
def test_a_lengths_array_of_counts_no_sample_has_is_refused(tmp_path, counts):
    """Before, such counts were dropped without a word (uint64 past int64's range turned negative,
    and negative ones fell under the 2-token minimum) and the rest read as the whole data."""
    np.save(tmp_path / "mine.npy", counts)
    with pytest.raises(DataError, match=r"mine.npy holds a token count of -?\d+; counts are 0 to 2147483647"):
        real.read_lengths(tmp_path / "mine.npy")


def test_whole_numbers_written_as_floats_are_counts(tmp_path):
    """JSON has one number type: 512.0 (pandas' float columns) is the count 512."""
    src = tmp_path / "floats.jsonl"
    src.write_text("512.0\n1e3\n7\n")
    assert load_lengths("jsonl", str(src)).tolist() == [512, 1000, 7]


def test_an_object_where_the_count_goes_names_its_keys(tmp_path):
    src = tmp_path / "nested.jsonl"
    src.write_text('{"meta": {"length": 12, "lang": "en"}}\n')
    with pytest.raises(DataError, match=r"line 1: .* got an object \(keys: length, lang\)$"):
        load_lengths("jsonl", str(src), field="meta")


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
    write_pending_caches()
    assert len(list(tmp_path.glob("ds.lengths-*.npy"))) == 1, "cached beside the dataset directory"
    chat = write_hf_dataset(tmp_path / "chat", counts, chat=True)
    assert load_lengths("hf_disk", str(chat), text_field="messages",
                        tokenizer=str(tok / "tokenizer.json")).tolist() == counts


def test_hf_dataset_with_token_ids_needs_no_tokenizer(tmp_path):
    import datasets

    datasets.Dataset.from_dict({"input_ids": [[1] * 5, [2] * 12]}).save_to_disk(str(tmp_path / "ids"))
    assert load_lengths("hf_disk", str(tmp_path / "ids"), text_field="input_ids").tolist() == [5, 12]


def test_hf_disk_reads_a_hub_folder_of_parquet_shards_split_by_file_name(tmp_path, monkeypatch):
    import datasets
    import pandas as pd

    from tests.helpers.real_data import text_of

    counts = [3, 17, 40, 8, 5]
    hub = tmp_path / "hub" / "data"
    hub.mkdir(parents=True)
    # The Hub's layout: {split}-{shard}-of-{shards}.parquet; train's rows come in shard order.
    for shard, part in enumerate((counts[:2], counts[2:])):
        pd.DataFrame({"text": [text_of(n, i) for i, n in enumerate(part)], "n": part}).to_parquet(
            hub / f"train-{shard:05d}-of-00002.parquet")
    pd.DataFrame({"text": ["a b"], "n": [2]}).to_parquet(hub / "test-00000-of-00001.parquet")
    # datasets' own cache is left alone: where it cannot be written (HF_HOME on a read-only home)
    # the stream failed to open a local file.
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    before = sorted(tmp_path.rglob("*"))
    tok = str(write_tokenizer(tmp_path / "tok"))
    assert load_lengths("hf_disk", str(tmp_path / "hub"), tokenizer=tok).tolist() == counts
    assert load_lengths("hf_disk", str(tmp_path / "hub"), text_field="n", split="test",
                        cache_dir=str(tmp_path / "c")).tolist() == [2]
    pool = load_pool("hf_disk", str(hub / "train-00001-of-00002.parquet"), tokenizer=tok)
    assert pool.lengths.tolist() == counts[2:] and pool.has_ids, "one shard read alone, its text tokenized"
    write_pending_caches()
    added = sorted(set(tmp_path.rglob("*")) - set(before) - set((tmp_path / "tok").rglob("*")) - {tmp_path / "tok"})
    assert all(".lengths-" in p.name or ".ids-" in p.name or p == tmp_path / "c" for p in added), (
        "streamed: nothing but the caches written beside the data")
    assert not (tmp_path / "hf-cache").exists()


def test_a_json_array_is_read_by_hf_disk_and_the_whatif_and_refused_by_jsonl(tmp_path):
    src = tmp_path / "table.json"
    # pandas' to_json(orient="records", indent=2): one array, over many lines
    src.write_text('[\n  {"n": 120, "id": 0},\n  {"n": 1, "id": 1},\n  {"n": 30, "id": 2}\n]\n')
    assert load_lengths("hf_disk", str(src), text_field="n").tolist() == [120, 30]
    assert real.read_lengths(src, field="n").tolist() == [120, 30], "the what-if's --field names the column"
    with pytest.raises(DataError, match="holds one JSON array of samples, not one JSON value per line"):
        load_lengths("jsonl", str(src), field="n")
    gz = tmp_path / "table.json.gz"
    gz.write_bytes(gzip.compress(b'[{"n": 5}]'))
    assert real.data_file_kind(gz) == "a JSON array"
    # a JSONL file whose first line is one sample's ids is JSON lines, not an array
    assert real.data_file_kind(write_jsonl(tmp_path / "ids.jsonl", [[5, 6, 7], [8, 9]])) is None


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
    with pytest.raises(DataError, match="cannot load .* with datasets .*point dataset.path at a folder written"):
        load_lengths("hf_disk", str(tmp_path / "empty"), tokenizer=tok)


def test_run_on_jsonl_uses_the_lengths_as_given_unless_asked_to_scale(tmp_path):
    src = write_jsonl(tmp_path / "r.jsonl", [640 + 64 * i for i in range(40)])
    spec = resolve(run_config("dataset=jsonl", f"dataset.path={src}", "num_minibatches=3", "warmup_minibatches=0"))
    assert spec.config.dataset.length_scale == 1 and spec.max_tokens == 640 + 64 * 39, "the longest sample"
    assert {n for mb in spec.minibatches for n in mb.lengths} <= {640 + 64 * i for i in range(40)}
    scaled = resolve(run_config("dataset=jsonl", f"dataset.path={src}", "dataset.length_scale=0.015625",
                                "dataset.num_samples=8", "num_minibatches=3", "warmup_minibatches=0"))
    assert scaled.max_tokens == (640 + 64 * 7) // 64
    assert {n for mb in scaled.minibatches for n in mb.lengths} <= {10 + i for i in range(8)}
    profile = resolve(run_config("num_minibatches=3", "warmup_minibatches=0"))
    assert profile.config.dataset.length_scale == 1 / 64, "profiles keep their CPU scale"


def test_a_run_prints_and_records_the_lengths_it_trains_on_and_caches_them_once_accepted(tmp_path, monkeypatch,
                                                                                           capsys):
    monkeypatch.chdir(tmp_path)
    src = write_jsonl(tmp_path / "s.jsonl", [100 + 10 * i for i in range(16)])
    results_dir = tmp_path / "results"
    (tmp_path / "file").write_text("")
    refused = odc_bench("backend=sim", "dataset=jsonl", f"dataset.path={src}", f"results_dir={tmp_path / 'file'}/x",
                        "world_size=4")
    assert refused == 2 and not list(tmp_path.glob("*.npy")), "a refused run caches nothing"
    capsys.readouterr()
    done = odc_bench("backend=sim", "dataset=jsonl", f"dataset.path={src}", f"results_dir={results_dir}",
                     "world_size=4", "minibatch_size=2", "num_minibatches=2", "warmup_minibatches=0")
    out, err = capsys.readouterr()
    assert done == 0, err
    row = read_table(results_dir / "runs.csv").iloc[0]
    assert row["length_scale"] == 1 and row["samples"] == 16 and row["len_max"] <= 250
    line = next(ln for ln in out.splitlines() if ln.startswith("lengths: "))
    assert line == (f"lengths: 16 samples of jsonl: mean {row['len_mean']:.0f}, p50 {row['len_p50']:.0f}, "
                    f"p99 {row['len_p99']:.0f}, max {row['len_max']} tokens; max_tokens {row['max_tokens']}")
    assert len(list(tmp_path.glob("s.jsonl.lengths-*.npy"))) == 1, "the accepted run cached its lengths"


def test_missing_data_is_a_one_line_error_and_no_row(tmp_path, results_dir, monkeypatch, capsys):
    with pytest.raises(ConfigError, match="dataset=jsonl needs dataset.path"):
        resolve(run_config("dataset=jsonl"))
    monkeypatch.chdir(tmp_path)
    status = odc_bench("dataset=jsonl", f"dataset.path={tmp_path / 'missing.jsonl'}", f"results_dir={results_dir}")
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert status == 2 and len(lines) == 1, err
    assert lines[0].startswith("odc_bench: error: dataset.path") and "does not exist" in lines[0]
    assert not (results_dir / "runs.csv").exists()


def test_a_run_that_draws_more_than_the_data_holds_says_how_often_each_sample_is_reused(tmp_path):
    src = write_jsonl(tmp_path / "few.jsonl", [100 + i for i in range(10)])
    spec = resolve(run_config("dataset=jsonl", f"dataset.path={src}", "world_size=2", "minibatch_size=4",
                              "num_minibatches=5", "warmup_minibatches=0"))
    assert spec.pool_size == 10 and spec.length_stats()["samples"] == 40
    assert describe_lengths(spec).startswith("lengths: 40 samples drawn from the 10 of jsonl (each used 4 times on "
                                             "average): ")
    once = resolve(run_config("dataset=jsonl", f"dataset.path={src}", "world_size=2", "minibatch_size=5",
                              "num_minibatches=1", "warmup_minibatches=0"))
    assert describe_lengths(once).startswith("lengths: 10 samples of jsonl: "), "no sample drawn twice: no note"


def test_too_few_samples_names_the_settings_that_change_the_outcome(tmp_path):
    src = write_jsonl(tmp_path / "few.jsonl", [100 + i for i in range(10)])
    data = ("dataset=jsonl", f"dataset.path={src}", "world_size=4", "num_minibatches=2", "warmup_minibatches=0")
    with pytest.raises(ConfigError, match="lower minibatch_size or world_size until their product is at most 10"):
        resolve(run_config(*data, "minibatch_size=3"))
    # What the hint says does not help does not: dataset.num_samples cannot add samples.
    with pytest.raises(ConfigError, match="fewer than one minibatch"):
        resolve(run_config(*data, "minibatch_size=3", "dataset.num_samples=1000"))
    assert resolve(run_config(*data, "minibatch_size=2")).pool_size == 10, "the named setting does"


def test_a_byte_order_mark_is_read_like_any_other_utf8_file(tmp_path):
    plain = write_jsonl(tmp_path / "plain.jsonl", [12, [1, 2, 3]])
    marked = tmp_path / "marked.jsonl"
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    assert load_lengths("jsonl", str(marked)).tolist() == load_lengths("jsonl", str(plain)).tolist() == [12, 3]
    objects = tmp_path / "objects.jsonl"
    objects.write_bytes(b"\xef\xbb\xbf" + b'{"n": 5}\n{"n": [7, 8]}\n')
    assert load_lengths("jsonl", str(objects), field="n").tolist() == [5, 2], "the first key is 'n', not '\\ufeffn'"


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be-marked", "utf-32"])
def test_a_utf16_or_utf32_file_with_its_byte_order_mark_is_read_as_the_same_text(tmp_path, encoding):
    """Windows PowerShell's `>` writes UTF-16 with a mark: it was "not text: it holds bytes that
    are not UTF-8"."""
    plain = write_jsonl(tmp_path / "plain.jsonl", [12, [1, 2, 3], 7])
    text = plain.read_text(encoding="utf-8")
    other = tmp_path / f"{encoding}.jsonl"
    if encoding == "utf-16-be-marked":
        other.write_bytes(b"\xfe\xff" + text.encode("utf-16-be"))
    else:
        other.write_text(text, encoding=encoding)
    assert load_lengths("jsonl", str(other)).tolist() == load_lengths("jsonl", str(plain)).tolist() == [12, 3, 7]
    unmarked = tmp_path / f"{encoding}-unmarked.jsonl"
    unmarked.write_bytes(text.encode("utf-16-be" if encoding == "utf-16-be-marked" else "utf-16-le"))
    with pytest.raises(DataError, match=r"line 1 holds NUL bytes \(UTF-16 text without its byte-order mark: save it "
                                        r"as UTF-8\)"):
        load_lengths("jsonl", str(unmarked))


def test_a_file_named_like_a_number_is_read_as_the_refusal_says(tmp_path, monkeypatch):
    """dataset.path=2024 reaches the config as the number 2024 (Hydra's grammar): refused in one
    line that says how to give it; both ways it names read the file."""
    write_jsonl(tmp_path / "2024", [100, 200, 300, 400])
    monkeypatch.chdir(tmp_path)
    data = ("dataset=jsonl", "world_size=2", "minibatch_size=2", "num_minibatches=1", "warmup_minibatches=0")
    said = r"""dataset\.path must be a string or null, got 2024; .* \('dataset\.path="2024"'\), or give a file """
    with pytest.raises(ConfigError, match=said + r"or folder of that name as \./2024$"):
        run_config(*data, "dataset.path=2024")
    for given in ('dataset.path="2024"', "dataset.path=./2024"):
        assert sorted(resolve(run_config(*data, given)).minibatches[0].lengths) == [100, 200, 300, 400]


def test_a_pipe_is_refused_in_one_line_that_says_to_write_it_to_a_file(tmp_path):
    """`dataset.path=<(command)` names a pipe, read once: it was "is not a file"."""
    pipe = tmp_path / "lengths.jsonl"
    os.mkfifo(pipe)
    with pytest.raises(DataError, match=r"is a pipe \(as the shell's <\(command\) gives\), which the harness cannot "
                                        r"read twice or cache beside; write it to a file"):
        load_lengths("jsonl", str(pipe))


def test_for_a_length_profile_the_hint_names_its_pool_size_which_changes_the_outcome():
    small = ("world_size=4", "minibatch_size=2", "num_minibatches=2", "warmup_minibatches=0")
    with pytest.raises(ConfigError, match=r"or raise dataset.num_samples to at least 8 \(the profile's pool\)"):
        resolve(run_config(*small, "dataset.num_samples=5"))
    assert resolve(run_config(*small, "dataset.num_samples=8")).pool_size == 8


@pytest.mark.parametrize("compress", [gzip.compress, bz2.compress, lzma.compress], ids=["gzip", "bzip2", "xz"])
def test_a_compressed_jsonl_file_reads_as_its_text_whatever_its_name(tmp_path, compress):
    plain = write_jsonl(tmp_path / "plain.jsonl", [12, [1, 2, 3], 40])
    packed = tmp_path / "corpus.jsonl.part"  # known by its first bytes, not its name
    packed.write_bytes(compress(b"\xef\xbb\xbf" + plain.read_bytes()))
    got, want = load_pool("jsonl", str(packed)), load_pool("jsonl", str(plain))
    assert got.lengths.tolist() == want.lengths.tolist() == [12, 3, 40]
    assert got.ids.tolist() == want.ids.tolist()
    cut = tmp_path / "cut.jsonl.gz"
    whole = compress("".join(f"{n}\n" for n in range(2, 5000)).encode())
    cut.write_bytes(whole[:len(whole) // 2])
    with pytest.raises(DataError, match=rf"^{cut} is (gzip|bzip2|xz)-compressed but damaged or cut short after line "
                                        r"\d+ \(.*\); compress it again, or give it uncompressed$"):
        load_pool("jsonl", str(cut))


def test_a_zstd_file_is_refused_with_the_command_that_unpacks_it(tmp_path):
    packed = tmp_path / "corpus.jsonl.zst"
    packed.write_bytes(b"\x28\xb5\x2f\xfd" + bytes(20))
    with pytest.raises(DataError, match=rf"^{packed} is zstd-compressed, which this Python does not read; decompress "
                                        rf"it \(zstd -d {packed}\) and give the file it writes$"):
        load_pool("jsonl", str(packed))


def test_a_hub_hint_is_given_only_for_what_looks_like_a_hub_id_and_is_no_local_path(tmp_path, monkeypatch):
    from odc_bench.config.hub import hub_hint

    monkeypatch.chdir(tmp_path)
    assert "hf download org/corpus --repo-type dataset --local-dir corpus" in hub_hint("org/corpus", "dataset", "{}")
    assert hub_hint("data/train.jsonl", "dataset", "{}") == "", "a relative path to a data file"
    assert hub_hint("corpus", "dataset", "{}") == hub_hint("/abs/org/x", "dataset", "{}") == ""
    (tmp_path / "org" / "corpus").mkdir(parents=True)
    assert hub_hint("org/corpus", "dataset", "{}") == "", "a folder of that name here is a path"


def test_a_csv_with_a_header_is_a_table_and_one_of_bare_counts_stays_json_lines(tmp_path):
    table = tmp_path / "lengths.csv"
    table.write_text("id,length\n0,120\n1,1\n2,45\n")  # pandas' to_csv(index=False)
    assert real.read_lengths(table, field="length").tolist() == [120, 45], "the what-if reads it with hf_disk"
    assert load_lengths("hf_disk", str(table), text_field="length").tolist() == [120, 45]
    with pytest.raises(DataError, match="is a CSV file with a header, not one JSON value per line; dataset=hf_disk"):
        load_lengths("jsonl", str(table))
    bare = tmp_path / "bare.csv"
    bare.write_text("120\n45\n")
    assert real.data_file_kind(bare) is None and load_lengths("jsonl", str(bare)).tolist() == [120, 45]


def test_a_csv_cell_pandas_takes_for_missing_is_named_as_such(tmp_path):
    """datasets reads CSV through pandas, which reads a cell saying NA or None as missing: the
    refusal said "got NoneType" of a file that holds no such thing."""
    tok = str(write_tokenizer(tmp_path / "tok"))
    texts = tmp_path / "texts.csv"
    texts.write_text("text\nhello world\nNone\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"texts\.csv column 'text' \(batch 0\): a sample has no text \(null; in a CSV "
                                        r"file, an empty cell or one reading NA, None, null, N/A or nan, which pandas "
                                        r"takes for missing\); fill it in or drop that sample$"):
        load_lengths("hf_disk", str(texts), tokenizer=tok)
    counts = tmp_path / "counts.csv"
    counts.write_text("id,length\n0,120\n1,NA\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"expected a token count or a list of token ids, got null \(in a CSV file, an "
                                        r"empty cell or one reading NA"):
        load_lengths("hf_disk", str(counts), text_field="length")
