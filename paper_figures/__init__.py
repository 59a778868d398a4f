"""The paper's figures and tables, drawn from results tables only (never by running training).

`python -m paper_figures [--results results] [--out paper_figures/out]` reads every runs.csv
and primitives.csv below the results root (see paper_figures.inputs) and writes PNG, PDF and
Markdown files; `--docs` writes the README's small PNGs into docs/figures/ instead. One module
per figure; each has `plot(...)` (DataFrames in, matplotlib Figure out) and `render(inputs)`.
"""
