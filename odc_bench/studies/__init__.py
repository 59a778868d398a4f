"""Studies: commands that run the harness (or its simulator) over many configurations and write
what they found, as results tables and the generated pages of docs/. Above the harness: nothing
in it imports them (import-linter's `stages` contract).

- paper.py: the paper's experiments at paper scale in the simulator (docs/simulator_paper.md);
- sensitivity.py: how much each assumption of the simulator moves the paper's cells (docs/sensitivity.md);
- validation.py: real CPU runs beside their simulation (docs/simulator_validation.md);
- staleness.py: stale-synchronous ODC measured against its model (docs/staleness.md);
- published.py: the GPU profiles against published GPU runs, fitted and held out (docs/gpu_validation.md).

Each is a command: `python -m odc_bench.studies.NAME`. A generated page's words are a Jinja
template, templates/PAGE.md.j2, which pages.py renders from the numbers the study computed; each
page can be written again from the committed results without running the study (`table`, or
`--doc-only`), and tests/unit/test_generated_pages.py checks that it is.
"""
