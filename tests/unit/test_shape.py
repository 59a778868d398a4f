"""The shape contracts (pyproject's [tool.importlinter], run by `make lint`) hold for the code as it
is, and each one fails when an import that breaks it is added to the real import graph."""

from __future__ import annotations

from copy import deepcopy
from functools import cache

import grimp
import pytest
from importlinter import configuration
from importlinter.adapters.building import GraphBuilder
from importlinter.application.app_config import settings
from importlinter.application.use_cases import lint_imports

from tests.helpers import REPO

CONTRACTS = ("library", "stages", "cycles", "figures")


@cache
def _code_graph(**options: object) -> grimp.ImportGraph:
    return GraphBuilder().build(**{**options, "cache_dir": None})


class _WithExtraImport(GraphBuilder):
    """The real import graph of the code, plus one import the code does not have."""

    def __init__(self, importer: str | None, imported: str | None) -> None:
        self.edge = (importer, imported)

    def build(self, **options: object) -> grimp.ImportGraph:
        options["root_package_names"] = tuple(options["root_package_names"])  # hashable, for the cache
        graph = deepcopy(_code_graph(**options))
        importer, imported = self.edge
        if importer is not None and imported is not None:
            graph.add_import(importer=importer, imported=imported)
        return graph


def broken_contracts(importer: str | None = None, imported: str | None = None) -> set[str]:
    configuration.configure()
    settings.configure(GRAPH_BUILDER=_WithExtraImport(importer, imported))
    try:
        return {contract for contract in CONTRACTS
                if not lint_imports(str(REPO / "pyproject.toml"), limit_to_contracts=(contract,), no_logo=True,
                                    is_debug_mode=True)}
    finally:
        configuration.configure()


def test_the_code_keeps_every_contract():
    assert broken_contracts() == set()


@pytest.mark.parametrize(("importer", "imported", "broken"), [
    ("odc_core.engine.odc", "odc_bench.config.run", {"library"}),
    # It also reaches torch from the figures, through the config the figures read.
    ("odc_bench.config.fields", "odc_bench.plan.spec", {"stages", "cycles", "figures"}),
    ("odc_bench.run.worker", "odc_bench.results.table", {"stages"}),
    ("odc_bench.results.collect", "odc_bench.results.compare", set()),
    ("odc_bench.results.series", "odc_bench.results.compare", {"cycles"}),
    ("paper_figures.fig8_throughput", "odc_bench.run.worker", {"figures"}),
])
def test_a_forbidden_import_breaks_its_contract(importer, imported, broken):
    """A backward or cyclic import is caught by name; an allowed one (one module of a stage
    reading another without a cycle) is not."""
    assert broken_contracts(importer, imported) == broken
