"""`python -m paper_figures`: draw every figure and table from the results tables.

Each figure module has `render(inputs) -> {name: Figure | str | Skip}`: a Figure is saved as
PNG and PDF, a string is a Markdown table, a Skip is printed with its reason while the other
figures still render. Nothing here runs training.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib import font_manager  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from odc_bench.errors import CommandParser, DataError, ends_cleanly  # noqa: E402
from odc_bench.files import atomic_path, atomic_write_text, writable_folder  # noqa: E402
from paper_figures.inputs import Inputs, LengthsFormat, Skip, load  # noqa: E402

MODULES = ["fig1_timeline", "fig7_lengths", "fig8_throughput", "fig9_rl", "fig10_acceleration", "fig11_bandwidth",
           "scaling", "convergence", "staleness", "utilization", "tables"]
DOCS_DIR = Path("docs/figures")
DOCS_DPI = 90


# Installed fonts that cover what DejaVu Sans lacks (CJK letters in a model's or dataset's name).
# matplotlib draws a glyph its first font lacks in the next family of font.family (a generic
# family there stands for one font only), and seaborn's theme replaces what a matplotlibrc gives.
_FALLBACK = ("Sans CJK", "Han Sans", "WenQuanYi", "Droid Sans Fallback")


def theme() -> None:
    sns.set_theme(context="paper", style="whitegrid", font_scale=1.1)
    installed = sorted({f.name for f in font_manager.fontManager.ttflist})
    plt.rcParams["font.family"] = [*plt.rcParams["font.family"],
                                   *(name for name in installed if any(k in name for k in _FALLBACK)
                                     and "Mono" not in name)]


def parser(only: str | None = None) -> argparse.ArgumentParser:
    p = CommandParser(f"python -m paper_figures{'.' + only if only else ''}",
                      description="Draw the paper's figures and tables from results tables only.")
    p.add_argument("--results", type=Path, default=Path("results"),
                   help="results root: every runs.csv / primitives.csv below it is read, or one table such as "
                        "`python -m odc_bench.results collect` writes (default: results)")
    p.add_argument("--out", type=writable_folder, default="paper_figures/out",
                   help="where PNG, PDF and Markdown files go (default: paper_figures/out)")
    p.add_argument("--lengths", type=Path, action="append", default=[], metavar="FILE",
                   help="a real dataset's lengths, drawn in Fig. 7 (repeatable): what the what-if reads, a lengths "
                        "file (one token count per line), a JSONL file, a dataset datasets reads (a folder written by "
                        "save_to_disk; Parquet, Arrow or CSV files, or a JSON array), or a lengths cache (.npy)")
    p.add_argument("--field", help="--lengths JSONL objects: the key holding the token count or ids")
    p.add_argument("--tokenizer", help="--lengths dataset's text: a local tokenizer folder or tokenizer.json")
    p.add_argument("--text-field", help="--lengths dataset's column to measure (default: --field, else text)")
    p.add_argument("--docs", action="store_true",
                   help=f"instead write small PNGs for the README into {DOCS_DIR}/ "
                        "(replacing the old ones of the figures drawn)")
    if only is None:
        p.add_argument("--only", nargs="+", choices=MODULES, help="draw only these")
    return p


def render_all(inputs: Inputs, modules: Sequence[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for name in modules:
        module = importlib.import_module(f"paper_figures.{name}")
        try:
            out.update(module.render(inputs))
        except Skip as skip:
            out[name] = skip
    return out


def write(results: dict[str, object], out: Path, docs: bool) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, item in results.items():
        if isinstance(item, Skip):
            print(f"skip {name}: {item}")
        elif isinstance(item, Figure):
            formats = ["png"] if docs else ["png", "pdf"]
            for fmt in formats:
                path = out / f"{name}.{fmt}"
                with atomic_path(path) as tmp:  # a full disk or Ctrl-C leaves the old file, not half a new one
                    item.savefig(tmp, format=fmt, dpi=DOCS_DPI if docs else 150, bbox_inches="tight")
                written.append(path)
            plt.close(item)
        elif not docs:
            path = out / f"{name}.md"
            atomic_write_text(path, item)
            written.append(path)
    for path in written:
        print(f"wrote {path}")
    return written


def main(argv: Sequence[str] | None = None, only: str | None = None) -> int:
    """Every entry point's (python -m paper_figures, each figure's module, odc-figures): Ctrl-C and
    a reader that leaves early end it in one line (ends_cleanly)."""
    p = parser(only)
    with ends_cleanly(p.prog):
        return _draw(p, p.parse_args(argv), only)


def _draw(p: argparse.ArgumentParser, args: argparse.Namespace, only: str | None) -> int:
    if not args.results.is_dir() and not (args.results.is_file() and args.results.suffix == ".csv"):
        p.error(f"results root {args.results} is neither a folder nor a .csv table; pass --results DIR (the folder "
                f"holding results tables) or a table that `python -m odc_bench.results collect` wrote")
    for path in args.lengths:
        if not path.exists():
            p.error(f"--lengths {path}: no such file or folder; pass a lengths file (one token count per line), a "
                    f"JSONL file, a dataset folder or a .npy lengths cache")
    modules = [only] if only else (args.only or MODULES)
    theme()
    try:
        inputs = load(args.results, args.lengths, LengthsFormat(args.field, args.tokenizer, args.text_field))
    except DataError as e:
        p.error(f"--lengths: {e}")
    for note in inputs.notes:
        print(f"note: {note}")
    out = args.out
    if args.docs:
        out = DOCS_DIR
        out.mkdir(parents=True, exist_ok=True)
        for old in [p for m in modules for p in out.glob(f"{m}*.png")]:
            old.unlink()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        write(render_all(inputs, modules), out, args.docs)
    missing = _missing_glyphs(caught)
    if missing:
        print(f"note: no installed font has a glyph for {' '.join(missing)} in the names the figures draw, drawn "
              f"as boxes; to draw them, install a font that has them (Debian: fonts-noto-cjk) and remove matplotlib's "
              f"font cache ({matplotlib.get_cachedir()}/fontlist-*.json), which lists the fonts it found before")
    return 0


_GLYPH = re.compile(r"Glyph (\d+) .*missing from font")


def _missing_glyphs(caught: list[warnings.WarningMessage]) -> list[str]:
    """The characters matplotlib warned it has no glyph for (a model named in CJK letters): one
    note, where each drawing of each such name printed a UserWarning of its own; every other
    warning is shown as it would have been."""
    missing: dict[str, None] = {}
    for w in caught:
        if (found := _GLYPH.search(str(w.message))) is not None:
            missing[chr(int(found.group(1)))] = None
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return list(missing)


if __name__ == "__main__":
    sys.exit(main())
