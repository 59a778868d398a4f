"""`python -m odc_bench --help` (or `help`): what the harness offers, read from where it lives.

The config groups and their options are the files under odc_bench/conf and sweeps/, the other
commands the modules of odc_bench/calibrate, studies and tools with their docstrings' first
paragraphs, so the text cannot fall behind the code. Hydra's own flags stay behind `--hydra-help`.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from odc_bench.config.compose import SWEEPS_DIR

CONF = Path(__file__).resolve().parents[1] / "conf"
PACKAGE = Path(__file__).resolve().parents[1]
# Packages of commands, each module one (`python -m odc_bench.PACKAGE.MODULE`).
COMMANDS = ("calibrate", "studies", "tools")
GROUPS = ("model", "dataset", "engine", "balancer", "backend", "backend/hardware", "task")

ENTRY_POINTS = (
    ("python -m odc_bench.whatif LENGTHS", "odc-whatif",
     "will ODC pay off for my data, my model and my cluster? a simulated verdict in seconds"),
    ("python -m odc_bench.calibrate.cluster_profile RUNS.csv", "",
     "a GPU profile fitted to a few collective FSDP runs measured on your cluster, for the what-if"),
    ("python -m odc_bench.results collect|compare|pairs|migrate", "odc-results",
     "merge results tables, print series side by side, read control sweeps pair by pair"),
    ("python -m paper_figures", "odc-figures", "the paper's figures and tables from results tables (never trains)"),
)


def _options(folder: Path) -> str:
    return ", ".join(sorted(p.stem for p in folder.glob("*.yaml")))


def runnable(module: Path) -> bool:
    """Whether `python -m` runs the module: it has an `if __name__ == "__main__":` block (a
    helper of the commands beside it, such as studies/pages.py, has none and is no command)."""
    def is_main_guard(node: ast.stmt) -> bool:
        test = node.test if isinstance(node, ast.If) else None
        return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
                and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators))

    return any(is_main_guard(node) for node in ast.parse(module.read_text(encoding="utf-8")).body)


def summary(module: Path) -> str:
    """The module docstring's first paragraph as one line: a first line alone can stop mid-sentence."""
    doc = ast.get_docstring(ast.parse(module.read_text(encoding="utf-8"))) or ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def _described(module: str, path: Path) -> str:
    what = textwrap.fill(summary(path), width=100, initial_indent=" " * 6, subsequent_indent=" " * 6,
                         break_on_hyphens=False, break_long_words=False)
    return f"  python -m {module}\n{what}"


def text() -> str:
    groups = [(g, _options(CONF / g)) for g in GROUPS] + [("sweep", _options(SWEEPS_DIR))]
    width = max(len(g) for g, _ in groups)
    named = " ".join(cmd for cmd, _, _ in ENTRY_POINTS)
    commands = [(f"odc_bench.{pkg}.{p.stem}", p) for pkg in COMMANDS for p in sorted((PACKAGE / pkg).glob("*.py"))
                if runnable(p) and f"odc_bench.{pkg}.{p.stem} " not in named + " "]
    lines = [
        "python -m odc_bench [group=option ...] [key=value ...]        (the odc-bench script)",
        "  One training run, by real ranks on this machine or in the simulator (backend=sim); its row goes to",
        "  results_dir/runs.csv (default results/local/). A sweep: sweep=NAME, or -m with comma lists (a=1,2).",
        "",
        "Config groups (group=option):",
        *[f"  {g:<{width}}  {options}" for g, options in groups],
        "  model= also takes your model's Hugging Face folder or config.json (model=/path/to/Llama-3.1-8B).",
        "  Every key and its value: python -m odc_bench --cfg job; what they mean: docs/configuration.md.",
        "",
        "Launchers (where a sweep's runs execute):",
        "  (default)             one after another on this machine",
        "  hydra/launcher=slurm  one SLURM job per run through submitit, a task per rank (docs/sweeps.md)",
        "",
        "Other entry points:",
        *[f"  {cmd}{f'  ({script})' if script else ''}\n      {what}" for cmd, script, what in ENTRY_POINTS],
        *[_described(module, p) for module, p in commands],
        "",
        "Examples:",
        "  python -m odc_bench                                      the default job (tiny model, 2 ranks, CPU)",
        "  python -m odc_bench engine=odc balancer=lb_mini repeat=3  ODC + LB-Mini, measured three times",
        "  python -m odc_bench.whatif examples/lengths.jsonl --model qwen2_7b --nodes 8",
        "  python -m odc_bench sweep=smoke hydra/launcher=slurm",
        "",
        "Devices: both engines run on CPU ranks and on GPUs; ODC on GPUs (CUDA IPC or NVSHMEM) has passed its",
        "  first test on one GPU and is not yet measured there (docs/gpu.md). make gpu-check is the one command",
        "  to run on a GPU machine.",
        "",
        "Bad input ends in one line and exit status 2 (docs/errors.md). Hydra's own flags: --hydra-help.",
    ]
    return "\n".join(lines)
