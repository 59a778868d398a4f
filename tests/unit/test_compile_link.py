"""torch.compile on CPU where torch cannot build or load its C++ code: torch (2.13, CI's)
writes the linker's library folders unquoted, so a torch or Python installed under a folder with
a space (a clone at ~/My Projects/odc-bench, whose .venv holds torch) cannot link; a cache folder
on a file system mounted noexec (a hardened /tmp) cannot load what was built. Either way every
compiled part fell back to eager after tens of thousands of lines of compiler output, in a run
recorded as compiled. Such a run is refused before it starts, in one line, with nothing written
(docs/errors.md, `compile-cannot-link`, run by tests/unit/test_errors.py)."""

import pytest
import torch.utils.cpp_extension

from odc_bench.errors import ConfigError
from odc_bench.plan import spec as plan_spec
from odc_bench.plan.device import cpu_compile_problem
from tests.helpers import run_spec

SPACED = "/opt/my tools/torch/lib"


def test_a_library_folder_with_a_space_is_named_from_torchs_own_builder(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(torch.utils.cpp_extension, "TORCH_LIB_PATH", SPACED.replace(" ", "-"))
    problem = cpu_compile_problem()
    assert problem is None or SPACED.replace(" ", "-") not in problem[0], "torch's folder without a space passes"
    monkeypatch.setattr(torch.utils.cpp_extension, "TORCH_LIB_PATH", SPACED)
    problem = cpu_compile_problem()
    assert problem is not None and problem[0].startswith(f"torch.compile's C++ build hands the linker {SPACED!r}")


def test_a_cache_folder_on_a_noexec_file_system_is_named(monkeypatch, tmpfs):
    noexec = tmpfs("16m", "noexec")
    monkeypatch.setattr(torch.utils.cpp_extension, "TORCH_LIB_PATH", SPACED.replace(" ", "-"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(noexec / "inductor"))  # made by torch on first use
    problem = cpu_compile_problem()
    assert problem is not None and problem[0] == (f"torch.compile loads the code it builds from {noexec / 'inductor'}, "
                                                  f"on a file system mounted noexec, which refuses to load it")
    assert not (noexec / "inductor").exists(), "the check makes no folder"


def test_compile_on_cpu_is_refused_where_it_cannot_build_and_passes_elsewhere(monkeypatch):
    monkeypatch.setattr(plan_spec, "cpu_compile_problem", lambda: ("why", "what to do"))
    spec = run_spec("device=cpu", "compile=true")
    with pytest.raises(ConfigError) as refused:
        spec.check_compile()
    assert str(refused.value) == "compile=true on CPU, but why; set compile=false, or what to do"
    for overrides in (("device=cpu",), ("device=cpu", "compile=false"), ("backend=sim", "compile=true")):
        run_spec(*overrides).check_compile()  # nothing compiled on CPU: nothing to build
    monkeypatch.setattr(plan_spec, "cpu_compile_problem", lambda: None)
    spec.check_compile()
