"""The ODC engine, one concern per module: unit.py (a flat unit's layout, buffers and state),
versions.py (the version-flag protocol: the one synchronisation per minibatch), fetch.py
(gathers and pushes), hooks.py (where a unit's life meets autograd), state_dict.py (full and
sharded state) and engine.py (OdcEngine, composing them; build())."""

from odc_core.engine.odc.engine import OdcEngine, build
from odc_core.engine.odc.versions import DONE, FLAGS, VERSION

__all__ = ["DONE", "FLAGS", "VERSION", "OdcEngine", "build"]
