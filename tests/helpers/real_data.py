"""Small real-data fixtures built on the fly: a JSONL file, a saved HF dataset, a tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "wizards",
         "quietly", "hex"]


def text_of(n_words: int, seed: int) -> str:
    return " ".join(WORDS[(seed * 7 + 3 * j) % len(WORDS)] for j in range(n_words))


def write_jsonl(path: Path, lines: list[object]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return path


def write_tokenizer(folder: Path) -> Path:
    """A word-level tokenizer over WORDS: one token per word, so lengths are word counts."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([" ".join(WORDS)], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder


def write_hf_dataset(folder: Path, word_counts: list[int], chat: bool = False) -> Path:
    """A saved DatasetDict (split train): a `text` column, or chat `messages` of two turns."""
    import datasets
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()
    texts = [text_of(n, i) for i, n in enumerate(word_counts)]
    if chat:
        half = [n // 2 for n in word_counts]
        rows = {"messages": [[{"role": "user", "content": text_of(h, i)},
                              {"role": "assistant", "content": text_of(n - h, i + 1)}]
                             for i, (n, h) in enumerate(zip(word_counts, half, strict=True))]}
    else:
        rows = {"text": texts}
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)}).save_to_disk(str(folder))
    return folder
