"""`python -m odc_bench.results collect|compare|pairs DIR...`: the results tables on the command line.

`collect` merges the tables under some folders into one tidy table for the figures; `compare`
prints every series beside the collective baseline (what `make demo` shows); `pairs` reads a
control sweep's back-to-back runs pair by pair (results/pairs.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from odc_bench.errors import PairingError
from odc_bench.results.collect import collect
from odc_bench.results.compare import comparison, print_comparison
from odc_bench.results.pairs import paired_ratios, print_pairs
from odc_bench.results.table import read_table

PROG = "odc_bench.results"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    col = commands.add_parser("collect", help="merge runs.csv tables (searched recursively) into one tidy table")
    col.add_argument("dirs", nargs="+", type=Path, metavar="DIR")
    col.add_argument("--out", type=Path, default=Path("results/collected.csv"),
                     help="the merged CSV (default: %(default)s); a .parquet beside it when pyarrow is installed")
    cmp = commands.add_parser("compare", help="print every series of a table beside the collective baseline")
    cmp.add_argument("dirs", nargs="+", type=Path, metavar="DIR")
    par = commands.add_parser("pairs", help="one engine against another, run by run within each results folder: "
                              "the median ratio and its 95%% interval")
    par.add_argument("dirs", nargs="+", type=Path, metavar="DIR")
    par.add_argument("--engine", default="odc", help="the numerator series (default: %(default)s)")
    par.add_argument("--baseline", default="collective",
                     help="the denominator series; collective[shm] names FSDP2's process group (default: %(default)s)")
    args = parser.parse_args(argv)
    missing = [str(d) for d in args.dirs if not d.is_dir()]
    if missing:
        print(f"{PROG}: error: not a directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.command == "collect":
        try:
            rows = collect(args.dirs, args.out)
        except FileNotFoundError as e:
            print(f"{PROG}: error: {e}; give the folders that hold the results (results_dir)", file=sys.stderr)
            return 2
        ok = int((rows["status"] == "ok").sum())
        print(f"{len(rows)} runs ({ok} ok) -> {args.out}")
        return 0
    tables = {str(p.parent): read_table(p) for d in args.dirs for p in sorted(d.rglob("runs.csv"))}
    if args.command == "compare":
        print_comparison(comparison(pd.concat(tables.values(), ignore_index=True)) if tables else pd.DataFrame())
        return 0
    try:
        pairs = paired_ratios(tables, args.engine, args.baseline)
    except PairingError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    print_pairs(pairs, args.engine, args.baseline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
