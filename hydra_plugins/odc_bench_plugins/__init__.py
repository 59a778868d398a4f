"""odc_bench's Hydra plugins: Hydra instantiates sweepers and launchers only from the
hydra_plugins namespace, so these names point it at the classes, which live with the rest of
the code (odc_bench/sweeper.py, odc_bench/launch/slurm.py)."""

from odc_bench import sweeper as _sweeper
from odc_bench.launch import slurm as _slurm


class GridSweeper(_sweeper.GridSweeper):
    """`hydra/sweeper=grids`: see odc_bench.sweeper."""


class SlurmLauncher(_slurm.SlurmLauncher):
    """`hydra/launcher=slurm`: see odc_bench.launch.slurm."""
