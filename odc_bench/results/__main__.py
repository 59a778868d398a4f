"""`python -m odc_bench.results collect|compare|pairs|migrate DIR...`: the results tables on the command line.

`collect` merges the tables under some folders into one tidy table for the figures; `compare`
prints every series beside the collective baseline (what `make demo` shows); `pairs` reads a
control sweep's back-to-back runs pair by pair (results/pairs.py); `migrate` brings tables of
an earlier schema to this one (results/migrate.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from odc_bench.errors import CommandParser, PairingError, TableError, ends_cleanly, said
from odc_bench.files import writable_file
from odc_bench.results.collect import collect, merged, tables_under, without_copies
from odc_bench.results.compare import comparison, print_comparison
from odc_bench.results.migrate import migrate
from odc_bench.results.pairs import paired_ratios, print_pairs
from odc_bench.results.table import read_table

PROG = "python -m odc_bench.results"


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser(PROG, description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    col = commands.add_parser("collect", help="merge runs.csv tables (searched recursively) into one tidy table")
    col.add_argument("dirs", nargs="+", type=Path, metavar="PATH", help="results folders or tables")
    col.add_argument("--out", type=writable_file, default="results/collected.csv",
                     help="the merged CSV (default: %(default)s); a .parquet beside it")
    cmp = commands.add_parser("compare", help="print every series of a table beside the collective baseline")
    cmp.add_argument("dirs", nargs="+", type=Path, metavar="PATH",
                     help="results folders (searched recursively) or tables, e.g. what `collect` wrote")
    par = commands.add_parser("pairs", help="one engine against another, run by run within each results folder: "
                              "the median ratio and its 95%% interval")
    par.add_argument("dirs", nargs="+", type=Path, metavar="PATH", help="results folders or tables")
    par.add_argument("--engine", default="odc", help="the numerator series (default: %(default)s)")
    par.add_argument("--baseline", default="collective",
                     help="the denominator series; collective[shm] names FSDP2's process group (default: %(default)s)")
    mig = commands.add_parser("migrate", help="rewrite the runs.csv tables (searched recursively) of an earlier "
                              "schema in this one")
    mig.add_argument("dirs", nargs="+", type=Path, metavar="PATH", help="results folders or tables")
    args = parser.parse_args(argv)
    missing = [str(d) for d in args.dirs if not os.path.exists(d)]  # False for a name too long, not an error
    if missing:
        print(f"{PROG}: error: no such folder or table: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        return _run(args)
    except (TableError, PairingError) as e:
        print(f"{PROG}: error: {said(e)}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.command == "migrate":
        for path, rows in migrate(args.dirs).items():
            print(f"{path}: {f'{rows} rows migrated' if rows else 'already in this schema'}")
        return 0
    notes: list[str] = []
    if args.command == "collect":
        rows = collect(args.dirs, args.out, notes)
        _print_notes(notes)
        print(f"{len(rows)} runs ({int((rows['status'] == 'ok').sum())} ok) -> {args.out}")
        return 0
    tables = tables_under(args.dirs)
    if args.command == "compare":
        rows = comparison(merged(tables, notes=notes))
        _print_notes(notes)
        if rows.empty:
            raise TableError(f"no successful run in {', '.join(map(str, args.dirs))} to compare")
        print_comparison(rows)
        return 0
    # A copied folder's pairs would count twice, and narrow the interval for nothing.
    frames = without_copies([read_table(t) for t in tables], tables, notes)
    _print_notes(notes)
    folders = [str(t.parent if t.name == "runs.csv" else t) for t in tables]
    pairs = paired_ratios(dict(zip(folders, frames, strict=True)), args.engine, args.baseline)
    print_pairs(pairs, args.engine, args.baseline)
    return 0


def _print_notes(notes: list[str]) -> None:
    for note in notes:
        print(f"note: {note}", file=sys.stderr)


if __name__ == "__main__":
    with ends_cleanly(PROG):
        status = main()
    sys.exit(status)
