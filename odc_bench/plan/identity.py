"""A run's identity: the key its config hashes to, and what is filed under it.

The key names a run in the results table (a sweep re-run skips what the table holds) and its
checkpoint folder (only a re-run of the same config resumes from it). It hashes the run's
whole resolved config but where results go, how often to repeat it, how it is checkpointed,
which warm-up minibatch is profiled and how long it may wait or run, none of which changes what
it measures; and, for a real source (a file or folder the config only names), the samples the
run draws from it; and, for a fitted file the config only names (a calibrated cost model, a
simulator profile's fit), what the run takes from it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from odc_bench.config.run import RunConfig
from odc_bench.config.unused import unused_settings
from odc_bench.data.profiles import PROFILES

# Top-level keys that do not change what a run measures.
UNKEYED = frozenset({"results_dir", "hydra", "repeat", "checkpoint", "profile_minibatch"})


def run_key(config: Mapping[str, Any]) -> str:
    """A stable hash of a run's config (plain values), minus the UNKEYED sections."""
    keyed = {k: v for k, v in config.items() if k not in UNKEYED}
    blob = json.dumps(keyed, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# Limits that end a run that hangs or overruns, and change nothing a run that ends measures: keyed
# at the values config.yaml gives them whatever a run's are, so that a sweep re-run with a longer
# timeout_s to rerun what timed out skips the runs already ok (they were keyed by their values,
# so such a re-run measured every run again), and rows recorded at these values keep their keys.
GUARDS: dict[str, object] = {"timeout_s": 120, "deadline_s": None}
# Sources the config names by path only (data/real.py): their contents can change under one config.
REAL_LOADERS = frozenset({"jsonl", "hf_disk"})


def keyed_config(config: RunConfig, drawn: str | None = None,
                 fitted: Mapping[str, object] | None = None) -> dict[str, Any]:
    """What a run's key hashes: its config and, for a length profile, the profile's definition,
    which lives in code (data/profiles.py): a profile refitted later (LongAlign's floor moved
    from 1K to 8K once) draws other lengths under the same config, so its runs get other keys
    and a re-run sweep does not take old rows for new ones. A real source's `drawn` digest
    (drawn_digest) does the same for a data file rewritten under its name, and `fitted` (the
    calibrated cost model's coefficients, the digest of a simulator profile's fit: spec.py's
    _fitted) for a calibration rewritten under its name: `calibrate.cost_model` run again, as
    the README's first steps suggest after `make demo`, planned every later run of the same
    config otherwise, and a re-run sweep skipped them all, keeping the rows of the old fit."""
    unused = unused_settings(config)  # each keyed as the run without it (config/unused.py)
    # A top-level setting through the config, whose dict leaves some unset ones out (compile).
    top: dict[str, Any] = {u.key: u.default for u in unused if "." not in u.key}
    plain = replace(config, **top)
    keyed = {**plain.to_dict(), **GUARDS}
    for u in unused:
        section, _, name = u.key.rpartition(".")
        if section and name in keyed.get(section, {}):
            keyed[section] = {**keyed[section], name: u.default}
    if config.dataset.loader == "profile" and config.dataset.profile in PROFILES:
        keyed["dataset"] = {**keyed["dataset"], "profile_definition": asdict(PROFILES[config.dataset.profile])}
    if drawn is not None:
        keyed["dataset"] = {**keyed["dataset"], "drawn": drawn}
    if fitted:
        keyed["fitted"] = dict(fitted)
    return keyed


def config_key(config: RunConfig, drawn: str | None = None, fitted: Mapping[str, object] | None = None) -> str:
    """The key of a resolved run config (and of what it draws from a real source and takes from
    a fitted file: keyed_config)."""
    return run_key(keyed_config(config, drawn, fitted))


def drawn_digest(minibatches: Sequence[tuple[Sequence[int], Sequence[int]]],
                 ids_of: Callable[[int], np.ndarray] | None = None) -> str:
    """A digest of the samples a run draws: each minibatch's sample indices and lengths, and the
    token ids of each sample (`ids_of(index)`) where the run trains on the source's own.

    What the samples are, not the file's size or time: a copy of the data (another disk, a
    checkout) keeps its runs' keys, and data rewritten under the same name (a filter fixed, a new
    tokenizer) gets new ones, where before a re-run sweep skipped its runs as done and kept the
    rows of the old data. Only the drawn samples: a change elsewhere in the source changes nothing
    a run measures."""
    digest = hashlib.sha256()
    for sample_ids, lengths in minibatches:
        digest.update(np.asarray(sample_ids, dtype=np.int64).tobytes())
        digest.update(np.asarray(lengths, dtype=np.int64).tobytes())
        if ids_of is not None:
            for sample in sample_ids:
                digest.update(np.ascontiguousarray(ids_of(sample), dtype=np.int64).tobytes())
    return digest.hexdigest()[:16]


def checkpoint_folder(config: RunConfig, run_id: str) -> Path:
    """Where a real run keeps its checkpoints: one folder per run key, so that only a re-run of
    the same config resumes from them. A checkpoint.dir of its own may serve several results
    folders (a scratch disk named in every command): there the folder is named by the results
    folder too, since two commands recording one config into two tables at once saved into one
    folder, and one's run failed on the other's files (or resumed from them)."""
    if config.checkpoint.dir is None:
        return Path(config.results_dir) / "checkpoints" / run_id
    table = hashlib.sha256(os.path.abspath(config.results_dir).encode()).hexdigest()[:8]
    return Path(config.checkpoint.dir) / f"{run_id}.{table}"
