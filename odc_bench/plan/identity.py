"""A run's identity: the key its config hashes to, and what is filed under it.

The key names a run in the results table (a sweep re-run skips what the table holds) and its
checkpoint folder (only a re-run of the same config resumes from it). It hashes the run's
whole resolved config but where results go, how often to repeat it, how it is checkpointed
and which warm-up minibatch is profiled, none of which changes what it measures.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from odc_bench.config.run import RunConfig
from odc_bench.data.profiles import PROFILES

# Top-level keys that do not change what a run measures.
UNKEYED = frozenset({"results_dir", "hydra", "repeat", "checkpoint", "profile_minibatch"})


def run_key(config: Mapping[str, Any]) -> str:
    """A stable hash of a run's config (plain values), minus the UNKEYED sections."""
    keyed = {k: v for k, v in config.items() if k not in UNKEYED}
    blob = json.dumps(keyed, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def keyed_config(config: RunConfig) -> dict[str, Any]:
    """What a run's key hashes: its config and, for a length profile, the profile's definition,
    which lives in code (data/profiles.py): a profile refitted later (LongAlign's floor moved
    from 1K to 8K once) draws other lengths under the same config, so its runs get other keys
    and a re-run sweep does not take old rows for new ones."""
    keyed = config.to_dict()
    if config.dataset.loader == "profile" and config.dataset.profile in PROFILES:
        keyed["dataset"] = {**keyed["dataset"], "profile_definition": asdict(PROFILES[config.dataset.profile])}
    return keyed


def config_key(config: RunConfig) -> str:
    """The key of a resolved run config."""
    return run_key(keyed_config(config))


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
