"""The what-if question as the runs that answer it: one `python -m odc_bench backend=sim` command
line per series and minibatch size.

The series are every engine the simulator models (odc_core's engine registry) with every
balancer the balancer registry marks for the verdict (`BalancerSpec.verdict`: LocalSort,
LB-Micro, LB-Mini; all of them on request), minus the pairs that cannot run together (collective
FSDP with a balancer that gives ranks different microbatch counts). The baseline is the paper's:
the baseline engine with LB-Micro. On request (`--staleness`), stale-synchronous series too:
each engine that has a staleness option at each value asked, with the balancer that plans for
it (docs/staleness.md); beyond the paper, so they stand beside the verdict, not in it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from odc_bench.balancers.registry import BALANCERS
from odc_bench.config.compose import hydra_error_line, hydra_quote, string_override
from odc_bench.config.engine import ENGINES
from odc_bench.config.fields import require
from odc_bench.config.hub import hub_hint
from odc_bench.config.model_file import is_model_file, model_file_name, model_file_overrides
from odc_bench.data.profiles import PROFILES
from odc_bench.data.real import loader_for
from odc_bench.errors import ConfigError, in_options
from odc_bench.files import name_too_long
from odc_bench.provenance import REPO_ROOT
from odc_bench.results.series import BASELINE_BALANCERS

# The settings the verdict's runs share unless the user overrides them: no trace files (the
# verdict reads the rows), balancers planning with the model's own FLOPs, no warm-up (nothing
# warms up in a simulation); on GPUs the paper's bf16 compute with fp32 reduction and activation
# checkpointing (what makes long samples fit). The CPU profile is this machine as it ran: fp32,
# no checkpointing.
DEFAULTS = ("backend.write_trace=false", "balancer.cost_model=flops", "warmup_minibatches=0")
GPU_DEFAULTS = ("precision=bf16", "backend.recompute=true")
# The stock hardware profiles (--hardware NAME); a profile file is the other kind of --hardware.
CONF = REPO_ROOT / "odc_bench" / "conf"
HARDWARE = tuple(sorted(p.stem for p in (CONF / "backend" / "hardware").glob("*.yaml")))
MODELS = tuple(sorted(p.stem for p in (CONF / "model").glob("*.yaml")))


# Keys the verdict varies or derives from its options, which an override must not change.
OWN_KEYS = {"backend", "engine", "balancer", "minibatch_size", "world_size", "model", "dataset", "num_minibatches",
            "backend/hardware", "backend.hardware.gpus_per_node", "dataset.path", "dataset.length_scale",
            "engine.staleness"}


@dataclass(frozen=True)
class Series:
    engine: str
    balancer: str
    staleness: int = 0  # engine.staleness: 0 is the synchronous engine of the paper

    @property
    def label(self) -> str:
        stale = f" [s={self.staleness}]" if self.staleness else ""
        return f"{ENGINES[self.engine].label}{stale} + {BALANCERS[self.balancer].label}"

    @property
    def is_baseline(self) -> bool:
        return ENGINES[self.engine].baseline and self.balancer == BASELINE_BALANCERS[0]


def series(all_balancers: bool = False, staleness: tuple[int, ...] = ()) -> list[Series]:
    """The series of the verdict, the baseline engine's first, each engine's in registry order;
    then, per staleness asked, each engine with that option paired with each carry planner."""
    out = []
    simulated = sorted(((e, s) for e, s in ENGINES.items() if s.simulated_as is not None),
                       key=lambda kv: not kv[1].baseline)
    for engine, spec in simulated:
        for balancer, b in BALANCERS.items():
            if (b.verdict or all_balancers) and not (spec.equal_microbatch_counts and not b.equal_counts):
                out.append(Series(engine, balancer))
    for s in sorted(set(staleness)):  # each value once, however often it was asked for
        out += [Series(engine, balancer, s) for engine, spec in simulated
                if spec.series_option == "staleness"
                for balancer, b in BALANCERS.items() if b.carry is not None]
    return out


# Harness keys the what-if derives from its options, and those options: an error about one of
# them speaks of the option the user gave, not of a key they never set.
DERIVED = (("backend.hardware.gpus_per_node", "--devices-per-node"), ("gpus_per_node", "--devices-per-node"),
           ("world_size", "the device count (--nodes x --devices-per-node)"), ("minibatch_size", "--minibatch"),
           ("num_minibatches", "--minibatches"), ("dataset.length_scale", "--length-scale"),
           ("dataset.field", "--field"), ("dataset.tokenizer", "--tokenizer"), ("dataset.text_field", "--text-field"))


def in_user_terms(message: str) -> str:
    """An error of the harness, with every key the what-if derived named by the what-if's option."""
    return in_options(message, DERIVED)


def _profile_kind(path: Path) -> object:
    """The `kind` a profile file states, read before anything is composed: the what-if sets a GPU
    profile's node size, which a file of another kind, or none, does not have (an error about
    that setting would name --devices-per-node, not the file). ConfigError for a file that is
    not settings by name."""
    try:
        with open(path, encoding="utf-8-sig") as stream:
            data = yaml.safe_load(stream)
    except yaml.YAMLError as e:
        raise ConfigError(hydra_error_line(e)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--hardware {path} cannot be read ({e}); give a profile file") from None
    held = "nothing" if data is None else f"a {type(data).__name__}"
    require(isinstance(data, dict), f"--hardware {path} holds {held} at its top, not a profile's settings by name "
                                    f"(key: value); fix the file")
    return data.get("kind")


@dataclass(frozen=True)
class Question:
    """What the user asks about, as command-line values."""

    lengths: str  # a profile name, a lengths/JSONL file, or a Hugging Face dataset folder
    model: str = "qwen2_7b"  # a model config, or a Hugging Face model folder or config.json
    hardware: str = "a100"
    nodes: int = 1
    devices_per_node: int = 8
    minibatch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    num_minibatches: int = 8
    field: str | None = None  # JSONL objects: the key holding the count or ids
    tokenizer: str | None = None  # a Hugging Face dataset's text: the tokenizer
    text_field: str | None = None
    length_scale: float = 1.0
    all_balancers: bool = False
    staleness: tuple[int, ...] = ()  # stale-synchronous series to add, beyond the paper's
    overrides: tuple[str, ...] = ()  # any other `key=value` of the harness

    def __post_init__(self) -> None:
        # A size or staleness given twice (--minibatch 2 2) is one question: once each, in the order given.
        object.__setattr__(self, "minibatch_sizes", tuple(dict.fromkeys(self.minibatch_sizes)))
        object.__setattr__(self, "staleness", tuple(dict.fromkeys(self.staleness)))
        require(self.nodes >= 1, f"--nodes must be at least 1, got {self.nodes}")
        require(self.devices_per_node >= 1, f"--devices-per-node must be at least 1, got {self.devices_per_node}")
        require(all(m >= 1 for m in self.minibatch_sizes) and len(self.minibatch_sizes) > 0,
                f"--minibatch takes one or more sizes >= 1 (samples per device), got {list(self.minibatch_sizes)}")
        require(self.num_minibatches >= 1, f"--minibatches must be at least 1, got {self.num_minibatches}")
        require(self.length_scale > 0, f"--length-scale must be a positive number, got {self.length_scale}")
        require(all(s >= 1 for s in self.staleness),
                f"--staleness takes values >= 1 (0 is the synchronous ODC the verdict has already), "
                f"got {list(self.staleness)}")
        for o in self.overrides:
            key = o.split("=", 1)[0].lstrip("+")
            require(key not in OWN_KEYS, f"{o!r}: the what-if sets {key} itself; use its options (--help) instead")
        require(self.model in MODELS or is_model_file(self.model),
                f"--model {self.model} is neither a model config ({', '.join(MODELS)}), nor a Hugging Face model "
                f"folder holding a config.json or such a .json file, nor a model config's .yaml file"
                f"{hub_hint(self.model, 'model', '--model {}')}")
        if self.hardware not in HARDWARE:
            path = Path(self.hardware).expanduser()
            require(path.is_file() and path.suffix == ".yaml" and path.parent.name == "hardware"
                    and path.parent.parent.name == "backend",
                    f"--hardware {self.hardware} is neither a profile ({', '.join(HARDWARE)}) nor a profile file "
                    f"DIR/backend/hardware/NAME.yaml (as python -m odc_bench.calibrate.cluster_profile writes one, and "
                    f"where Hydra's search path finds it)")
            require(path.stem not in HARDWARE,
                    f"--hardware {self.hardware}: a profile file named as the stock profile {path.stem} is not "
                    f"read (Hydra finds the stock one first); rename it, and its name: field, to a name of its own, "
                    f"or give --name another name when python -m odc_bench.calibrate.cluster_profile writes it")
            kind = _profile_kind(path)
            require(kind == "gpu", f"--hardware {self.hardware} is not a GPU profile (kind: {kind}); the what-if "
                                   f"asks about GPUs: give a profile that says kind: gpu, as python -m "
                                   f"odc_bench.calibrate.cluster_profile writes one, or --hardware cpu for this "
                                   f"machine")

    @property
    def hardware_file(self) -> Path | None:
        """The profile file --hardware names, or None for a stock profile."""
        return None if self.hardware in HARDWARE else Path(self.hardware).expanduser().resolve()

    @property
    def hardware_name(self) -> str:
        return self.hardware_file.stem if self.hardware_file else self.hardware

    @property
    def model_name(self) -> str:
        """The model as rows and titles name it."""
        return self.model if self.model in MODELS else model_file_name(self.model)

    def model_overrides(self) -> list[str]:
        """The model's settings: its config, or the shape its own file gives."""
        return [f"model={self.model}"] if self.model in MODELS else model_file_overrides(self.model)

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node

    def data_overrides(self) -> list[str]:
        """The dataset the lengths come from, at the scale asked (1: as they are)."""
        scale = [f"dataset.length_scale={self.length_scale:g}"]
        if self.lengths in PROFILES:
            return [f"dataset={self.lengths}", *scale]
        path = Path(self.lengths).expanduser()
        too_long = name_too_long(path)
        require(too_long is None, f"{self.lengths} {too_long}: no file can have it; give the lengths file's path")
        require(path.exists(), f"{self.lengths} is neither a length profile ({', '.join(sorted(PROFILES))}) nor a "
                               f"file or folder; give a lengths file (one token count per line), a JSONL file or a "
                               f"dataset (saved with save_to_disk, or Parquet files)"
                               f"{hub_hint(self.lengths, 'dataset', '{}')}")
        # As given, relative paths too: the printed commands run from the same folder.
        if loader_for(path) == "hf_disk":
            out = ["dataset=hf_disk", string_override("dataset.path", path), *scale]
            if self.tokenizer:
                out.append(string_override("dataset.tokenizer", Path(self.tokenizer).expanduser()))
            # --field names a JSONL object's key; in a table (a JSON array, Parquet) it is the column
            if column := self.text_field or self.field:
                out.append(string_override("dataset.text_field", column))
            return out
        require(not self.tokenizer and not self.text_field,
                "--tokenizer and --text-field are for a dataset folder; a lengths or JSONL file holds token counts "
                "or ids already")
        return ["dataset=jsonl", string_override("dataset.path", path),
                *([string_override("dataset.field", self.field)] if self.field else []),
                *scale]

    def shared(self) -> list[str]:
        """The overrides every run of the verdict shares (before the user's own)."""
        file = self.hardware_file
        # A profile file joins the config through Hydra's search path, as `python -m odc_bench` reads it too.
        search = hydra_quote(f"file://{file.parent.parent.parent}") if file else ""
        hardware = ([f"hydra.searchpath=[{search}]", f"backend/hardware={file.stem}"] if file else
                    [f"backend/hardware={self.hardware}"])
        if self.hardware != "cpu":  # the calibrated CPU profile has no node size: it is this machine
            hardware += [f"backend.hardware.gpus_per_node={self.devices_per_node}", *GPU_DEFAULTS]
        return ["backend=sim", *hardware, f"world_size={self.world_size}", *self.model_overrides(),
                f"num_minibatches={self.num_minibatches}", *DEFAULTS, *self.data_overrides()]

    def run(self, s: Series, minibatch_size: int) -> list[str]:
        """The command line of one row: `python -m odc_bench` with these overrides (the user's last: they win)."""
        stale = [f"engine.staleness={s.staleness}"] if s.staleness else []
        return [*self.shared(), f"engine={s.engine}", *stale, f"balancer={s.balancer}",
                f"minibatch_size={minibatch_size}", *self.overrides]
