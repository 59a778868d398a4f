"""odc_bench's Hydra plugins: Hydra instantiates sweepers and launchers only from the
hydra_plugins namespace, so these names point it at the classes, which live with the rest of
the code (odc_bench/cli/sweeper.py, odc_bench/cli/slurm.py)."""

from odc_bench.cli import slurm as _slurm
from odc_bench.cli import sweeper as _sweeper


class GridSweeper(_sweeper.GridSweeper):
    """`hydra/sweeper=grids`: see odc_bench.cli.sweeper."""


class SlurmLauncher(_slurm.SlurmLauncher):
    """`hydra/launcher=slurm`: see odc_bench.cli.slurm."""
