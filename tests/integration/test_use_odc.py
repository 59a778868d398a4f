"""docs/use_odc.md cannot rot: its files are written out and run (the FSDP2 loop and its ODC
conversion on 2 CPU ranks under torchrun, which must end with the same parameters), and each
other code block runs and prints the output the page shows."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import REPO, torchrun

PAGE = REPO / "docs" / "use_odc.md"
CODE = re.compile(r"```python\n(.*?)```(?:\s*```text\n(.*?)```)?", re.DOTALL)


def _blocks() -> tuple[dict[str, str], list[tuple[str, str]]]:
    """The page's files (blocks opening with `# NAME.py`) and its snippets with their output."""
    files, snippets = {}, []
    for code, shown in CODE.findall(PAGE.read_text()):
        first = code.splitlines()[0]
        if re.fullmatch(r"# \w+\.py", first):
            files[first[2:]] = code
        else:
            snippets.append((code, shown))
    return files, snippets


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("use_odc")
    files, _ = _blocks()
    assert set(files) == {"tiny_lm.py", "train_fsdp2.py", "train_odc.py"}
    for name, code in files.items():
        (folder / name).write_text(code)
    return folder


@pytest.mark.slow
def test_the_fsdp2_loop_and_its_odc_conversion_end_with_the_same_parameters(written: Path) -> None:
    for script in ("train_fsdp2.py", "train_odc.py"):
        torchrun(script, cwd=written)
    fsdp2, odc = torch.load(written / "fsdp2.pt"), torch.load(written / "odc.pt")
    assert sorted(fsdp2) == sorted(odc)
    sys.path.insert(0, str(written))
    try:
        import tiny_lm

        torch.manual_seed(0)
        initial = dict(tiny_lm.TinyLM().named_parameters())
    finally:
        sys.path.remove(str(written))
        sys.modules.pop("tiny_lm", None)
    assert max((odc[n] - initial[n].detach()).abs().max().item() for n in odc) > 1e-3  # they trained
    worst = max((fsdp2[n] - odc[n]).abs().max().item() for n in odc)
    assert worst < 1e-5, f"the ODC loop ends {worst:.2e} away from the FSDP2 loop"


def test_every_snippet_prints_what_the_page_shows() -> None:
    _, snippets = _blocks()
    assert snippets
    for code, shown in snippets:
        out = subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120,
                             capture_output=True, text=True).stdout
        assert out == shown, f"the page shows\n{shown}but the code prints\n{out}"
