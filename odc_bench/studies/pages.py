"""The pages of docs/ that studies generate: each a Jinja template in templates/ (NAME.md.j2),
rendered from the numbers its study computed. The study computes; the template words it.

Templates wrap their prose freely: a `{% filter para %}` block is one Markdown paragraph, its
lines joined by single spaces, so a template reads like the page and the page keeps one line
per paragraph.
"""

from __future__ import annotations

import math
from typing import Any

import jinja2
import pandas as pd


def fmt(value: Any, spec: str = "", missing: str = "") -> str:
    """`value` formatted by a Python format spec; `missing` for None or NaN (a cell not run)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return format(value, spec)


def para(text: str) -> str:
    """A paragraph wrapped in the template, as one line (ending in a newline, as the line it replaces)."""
    return " ".join(line.strip() for line in text.strip().splitlines()) + "\n"


def markdown(frame: pd.DataFrame, floatfmt: str = ".3g") -> str:
    """A table as Markdown, every float to `floatfmt`."""
    return frame.to_markdown(index=False, floatfmt=floatfmt)


ENV = jinja2.Environment(loader=jinja2.PackageLoader("odc_bench.studies", "templates"),
                         undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True,
                         lstrip_blocks=True, autoescape=False)
ENV.filters.update(fmt=fmt, para=para, markdown=markdown)


def render(name: str, **values: Any) -> str:
    """The page `name` (templates/NAME.md.j2) from `values`."""
    return ENV.get_template(f"{name}.md.j2").render(**values)
