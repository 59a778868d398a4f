"""Each page of docs/ that a study generates is what its template renders from the committed
results: re-rendered here (no simulation) and compared byte for byte. A failure means the page,
the template or the results changed alone; the study's table or --doc-only mode writes it again.
docs/gpu_validation.md has the same test in test_gpu_validation.py."""

import pytest

from odc_bench.provenance import REPO_ROOT
from odc_bench.studies import paper, sensitivity, validation

DOCS = REPO_ROOT / "docs"


def test_simulator_paper_page_renders_from_the_committed_sweeps(tmp_path):
    page = paper.table(paper.RESULTS, tmp_path / "page.md")
    assert page == (DOCS / "simulator_paper.md").read_text(), "run python -m odc_bench.studies.paper table"


def test_sensitivity_page_renders_from_the_committed_points(tmp_path):
    page = sensitivity.table(sensitivity.ROWS, tmp_path / "page.md")
    assert page == (DOCS / "sensitivity.md").read_text(), "run python -m odc_bench.studies.sensitivity table"


def test_simulator_validation_page_renders_from_the_committed_runs(tmp_path):
    validation.main(["--doc-only", "--docs", str(tmp_path / "page.md")])
    assert (tmp_path / "page.md").read_bytes() == (DOCS / "simulator_validation.md").read_bytes(), \
        "run python -m odc_bench.studies.validation --doc-only"


def test_a_missing_value_in_a_template_is_an_error_not_a_blank():
    from jinja2 import UndefinedError

    from odc_bench.studies.pages import render
    with pytest.raises(UndefinedError):
        render("simulator_validation", runs=[], repeatability=[], ratios=[])
