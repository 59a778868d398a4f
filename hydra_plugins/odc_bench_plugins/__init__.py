"""odc_bench's Hydra plugins: Hydra instantiates sweepers, launchers and config sources only from
the hydra_plugins namespace, so these names point it at the classes, which live with the rest of
the code (odc_bench/cli/sweeper.py, odc_bench/cli/slurm.py, odc_bench/config/model_source.py)."""

from odc_bench.cli import slurm as _slurm
from odc_bench.cli import sweeper as _sweeper
from odc_bench.config import model_source as _model_source


class GridSweeper(_sweeper.GridSweeper):
    """`hydra/sweeper=grids`: see odc_bench.cli.sweeper."""


class SlurmLauncher(_slurm.SlurmLauncher):
    """`hydra/launcher=slurm`: see odc_bench.cli.slurm."""


class HfModelSource(_model_source.HfModelSource):
    """`model=PATH` (a Hugging Face model folder or config.json): see odc_bench.config.model_source."""


class HfPathSource(_model_source.HfPathSource):
    """`model=./PATH` and other values only a path can be: see odc_bench.config.model_source."""


class HfModelSearchPath(_model_source.HfModelSearchPath):
    """Puts HfPathSource and HfModelSource on Hydra's search path."""
