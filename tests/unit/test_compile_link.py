"""torch.compile on CPU where torch's C++ build cannot link: torch (2.13, CI's) writes the
linker's library folders unquoted, so a torch or Python installed under a folder with a space
(a clone at ~/My Projects/odc-bench, whose .venv holds torch) failed every compiled part after
tens of thousands of lines of compiler output and ran eagerly, recorded as compiled. Such a run
is refused before it starts, in one line, with nothing written (docs/errors.md,
`compile-cannot-link`, run by tests/unit/test_errors.py)."""

import pytest
import torch.utils.cpp_extension

from odc_bench.errors import ConfigError
from odc_bench.plan import spec as plan_spec
from odc_bench.plan.device import link_folders_split
from tests.helpers import run_spec

SPACED = "/opt/my tools/torch/lib"


def test_the_probe_names_a_library_folder_this_torch_would_split_at_its_space(monkeypatch):
    """Read from torch's own builder: its folders as this torch writes them, split where the
    command line splits them; torch's folder without a space passes."""
    monkeypatch.setattr(torch.utils.cpp_extension, "TORCH_LIB_PATH", SPACED.replace(" ", "-"))
    assert SPACED.replace(" ", "-") not in link_folders_split()
    monkeypatch.setattr(torch.utils.cpp_extension, "TORCH_LIB_PATH", SPACED)
    assert SPACED in link_folders_split()


def test_compile_on_cpu_is_refused_where_the_build_cannot_link_and_passes_elsewhere(monkeypatch):
    monkeypatch.setattr(plan_spec, "link_folders_split", lambda: [SPACED])
    spec = run_spec("device=cpu", "compile=true")
    with pytest.raises(ConfigError) as refused:
        spec.check_compile()
    said = str(refused.value)
    assert said.startswith(f"compile=true on CPU, but torch.compile's C++ build hands the linker {SPACED!r} unquoted")
    assert "set compile=false" in said and "\n" not in said
    for overrides in (("device=cpu",), ("device=cpu", "compile=false"), ("backend=sim", "compile=true")):
        run_spec(*overrides).check_compile()  # nothing compiled on CPU: nothing to link
    monkeypatch.setattr(plan_spec, "link_folders_split", lambda: [])
    spec.check_compile()

