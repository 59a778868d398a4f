"""A Hugging Face Hub id given where the harness reads a local path (`model=Qwen/Qwen2.5-7B`,
`dataset.path=zai-org/LongAlign-10k`): what to say beside "not found".

The harness downloads nothing (its runs must not depend on a network, and CI has none), so the
message names the download that makes the id a folder: huggingface_hub's `hf download` into a
folder named for the repository, which model=PATH, --model and dataset=hf_disk then read.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

# owner/name as the Hub spells repositories; a name ending like a data file is a relative path.
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_FILE_SUFFIXES = frozenset({".json", ".jsonl", ".parquet", ".arrow", ".csv", ".txt", ".npy", ".gz", ".bz2", ".xz",
                            ".zst", ".yaml", ".yml"})


def hub_hint(value: str, repo_type: Literal["model", "dataset"], give: str) -> str:
    """Empty where `value` is a local path or not shaped like a Hub id; else a parenthesis for a
    message: the download that gives the folder to name instead, and `give` with that folder in
    its {} (how the command takes it: "model={}", "--model {}")."""
    if not _HUB_ID.fullmatch(value) or Path(value).suffix.lower() in _FILE_SUFFIXES:
        return ""
    if Path(value).expanduser().exists():
        return ""
    folder = value.split("/", 1)[1]
    files = " config.json" if repo_type == "model" else " --repo-type dataset"
    return (f" (if {value} is a Hugging Face Hub id: the harness downloads nothing; fetch it with `hf download "
            f"{value}{files} --local-dir {folder}` and give {give.format(folder)})")
