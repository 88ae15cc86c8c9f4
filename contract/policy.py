"""The serving policy: how many workers serve a model, how they batch and how many threads each one runs,
resolved by one function (resolve_policy) from the machine that serves, the archive's pins and the command's
flags, with the reason for every value.

GPU: one worker per GPU, batches of up to GPU_BATCH_SIZE within GPU_BATCH_DELAY_MS keep the device busy.
CPU: batching gains no throughput on a CPU (a batch costs what its rows cost one by one) and its delay adds
latency, while a worker per core overlaps one request's decoding with another's inference (measured with
`python -m measure bench`: docs/benchmarks.md). Workers are capped at MAX_CPU_WORKERS so a many-core host does
not load dozens of copies; threads per worker = cores // workers, so workers x threads never exceeds the cores
(TorchServe's defaults oversubscribe and throughput collapses).

What the archive pins (`python -m export --workers ...`, model-config.yaml) wins over the command's flags
(`python -m serving --workers ...`), which win over the machine. `python -m serving` resolves each model's
policy once and writes it in the engine's run config, which the engines and the handler read as it is.
Standard library only: the archive ships it, and export's command line declares its pins with it.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field, fields
from typing import Any, NamedTuple

from contract.errors import VisionExportError

GPU_BATCH_SIZE = 8
GPU_BATCH_DELAY_MS = 50
CPU_BATCH_DELAY_MS = 5  # unused at batch size 1; TorchServe wants a value
MAX_CPU_WORKERS = 4
PINNED = "the archive pins it"
# What one request may carry, on every engine: TorchServe's own default max_request_size (its shipped config
# sets the same), which our servers read no further than (serving/bounds.py), and the photos of one request
# (KServe's v1 instances, v2's batch), each a full decode and inference a single client could otherwise queue.
MAX_BODY_BYTES = 8 * 2**20
MAX_PHOTOS_PER_REQUEST = 32
# The image formats a request may carry (as PIL names them); another one PIL can read is refused all the same
ACCEPTED_FORMATS = ("JPEG", "PNG", "WEBP", "BMP", "GIF", "TIFF", "MPO")


class PolicyError(VisionExportError):
    """A policy value out of its range (a flag or an archive's pin); the message names it."""


class Machine(NamedTuple):
    """What the machine that serves offers: GPUs CUDA can use, CPU cores this process may run on."""

    gpus: int
    cores: int


@dataclass(frozen=True)
class PolicyOption:
    """One value of the policy as a command line offers it and as model-config.yaml pins it."""

    name: str  # the ServingPolicy field
    label: str  # how a reason names it: "threads 1: --threads"
    flag: str
    what: str
    default: str  # what the machine gives when nothing is chosen
    minimum: int
    pin_key: str  # model-config.yaml's key (handler.threads: the handler's section)
    unit: str = ""

    def said(self, value: int, why: str) -> str:
        return f"{self.label} {value}{self.unit}: {why}"

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


OPTIONS = (
    PolicyOption("workers", "workers", "--workers",
                 "workers per model (worker processes; Ray: replicas)",
                 f"one per GPU, else one per CPU core up to {MAX_CPU_WORKERS}", 1, "minWorkers"),
    PolicyOption("batch_size", "batch size", "--batch-size", "rows per batch",
                 f"{GPU_BATCH_SIZE} on a GPU, 1 on a CPU", 1, "batchSize"),
    PolicyOption("max_batch_delay_ms", "batch delay", "--max-batch-delay", "ms a batch waits for more rows",
                 f"{GPU_BATCH_DELAY_MS} on a GPU", 0, "maxBatchDelay", " ms"),
    PolicyOption("threads_per_worker", "threads", "--threads", "CPU threads per worker", "cores / workers", 1,
                 "threads"),
)
OPTION = {option.name: option for option in OPTIONS}
EXPORT_PINS = ("workers", "batch_size", "max_batch_delay_ms")  # what `python -m export` may pin in model-config.yaml


def add_policy_options(parser: argparse.ArgumentParser, names: tuple[str, ...] = tuple(OPTION),
                       pinned: bool = False) -> None:
    """The policy's flags (names: which of OPTIONS), declared once for every command that takes them: `pinned`
    for export, which writes them into the archive, else for a command that serves or deploys."""
    title = ("serving policy pinned in the archive (default: not pinned, decided where it is served)" if pinned
             else "serving policy (default: decided for this machine; pinned archive values win)")
    group = parser.add_argument_group(title)
    for option in (OPTION[name] for name in names):
        help_text = (f"pin {option.what} in the archive ({option.pin_key}; default: {option.default})" if pinned
                     else f"{option.what} (default: {option.default})")
        group.add_argument(option.flag, dest=option.dest, type=int, default=None, help=help_text)


@dataclass(frozen=True)
class PolicyChoices:
    """Values chosen for a policy (None: not chosen) and why: `why` None is the command's flag of each value
    ("--threads"), else its own words (PINNED for the archive's)."""

    workers: int | None = None
    batch_size: int | None = None
    max_batch_delay_ms: int | None = None
    threads_per_worker: int | None = None
    why: str | None = None

    def __post_init__(self) -> None:
        for option in OPTIONS:
            value = getattr(self, option.name)
            if value is not None and value < option.minimum:
                said = option.flag if self.why is None else f"{option.pin_key} ({self.why})"
                raise PolicyError(f"{said} must be {'at least 1' if option.minimum else '0 or more'}, got {value}")

    @classmethod
    def from_flags(cls, args: argparse.Namespace) -> PolicyChoices:
        """The flags add_policy_options declared (a parser may declare only some of them)."""
        return cls(**{option.name: getattr(args, option.dest, None) for option in OPTIONS})

    @classmethod
    def pinned_in(cls, model_config: dict[str, Any] | None) -> PolicyChoices:
        """What an archive's model-config.yaml (parsed) pins: TorchServe's keys and the handler's threads."""
        config = dict(model_config or {})
        handler = config.get("handler") or {}
        values = {option.name: (handler if option.name == "threads_per_worker" else config).get(option.pin_key)
                  for option in OPTIONS}
        return cls(**{name: pinned_number(value, OPTION[name]) for name, value in values.items()}, why=PINNED)

    def reason(self, name: str) -> str:
        return OPTION[name].flag if self.why is None else self.why


NOTHING_CHOSEN = PolicyChoices()


def pinned_number(value: Any, option: PolicyOption) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise PolicyError(f"model-config.yaml's {option.pin_key} must be a number, got {value!r}: re-export "
                          "the archive with `python -m export`") from None


@dataclass(frozen=True)
class ServingPolicy:
    workers: int
    batch_size: int
    max_batch_delay_ms: int
    threads_per_worker: int  # CPU threads of torch / ONNX Runtime in each worker (GPU: host-side threads)
    device: str  # "gpu" or "cpu": what the machine offered
    reason: str  # one line: what the machine offered and gives, and any value chosen instead
    reasons: dict[str, str] = field(default_factory=dict, hash=False)  # per value: why it is what it is

    def model_config(self) -> dict[str, int]:
        """TorchServe's per-model keys."""
        return {"minWorkers": self.workers, "maxWorkers": self.workers, "batchSize": self.batch_size,
                "maxBatchDelay": self.max_batch_delay_ms}

    def lines(self) -> list[str]:
        """Each value with its reason: "workers 2: one per CPU core, 2 cores", "threads 1: --threads"."""
        return [option.said(getattr(self, option.name), self.reasons.get(option.name, self.reason))
                for option in OPTIONS]

    def describe(self) -> dict[str, Any]:
        """What an engine's model description shows: the values, and the reason of each."""
        return {**{name: getattr(self, name) for name in OPTION}, "device": self.device, "why": self.lines()}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServingPolicy:
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})


def resolve_policy(machine: Machine, pins: PolicyChoices = NOTHING_CHOSEN,
                   flags: PolicyChoices = NOTHING_CHOSEN) -> ServingPolicy:
    """THE serving policy of one model: each value pinned by its archive, else chosen by the command's flags,
    else given by the machine; threads, when neither chooses them, are the cores shared by the workers."""
    machine = Machine(max(0, machine.gpus), max(1, machine.cores))
    chosen = {name: chosen_value(name, pins, flags) for name in OPTION}
    given, device, machine_reason = machine_values(machine)
    values = {name: chosen[name] or given[name] for name in given}
    workers = values["workers"][0]
    values["threads_per_worker"] = chosen["threads_per_worker"] or (
        max(1, machine.cores // workers), f"{machine.cores} cores / {workers} worker(s)")
    said = [OPTION[name].said(*choice) for name, choice in chosen.items() if choice]
    return ServingPolicy(**{name: value for name, (value, _) in values.items()}, device=device,
                         reason="; ".join([machine_reason, *said]),
                         reasons={name: why for name, (_, why) in values.items()})


def chosen_value(name: str, pins: PolicyChoices, flags: PolicyChoices) -> tuple[int, str] | None:
    """(value, reason) the archive pins, else the flag chooses; None when neither does."""
    for choices in (pins, flags):
        if getattr(choices, name) is not None:
            return getattr(choices, name), choices.reason(name)
    return None


def machine_values(machine: Machine) -> tuple[dict[str, tuple[int, str]], str, str]:
    """({value: (the machine's value, why)}, device, the machine's reason) for workers and batching."""
    gpus, cores = machine
    if gpus > 0:
        return ({"workers": (gpus, f"one per GPU, {gpus} GPU(s)"),
                 "batch_size": (GPU_BATCH_SIZE, "a GPU is kept busy by batches"),
                 "max_batch_delay_ms": (GPU_BATCH_DELAY_MS, "how long a GPU batch waits for more rows")},
                "gpu", f"{gpus} GPU(s): one batching worker per GPU")
    workers = min(cores, MAX_CPU_WORKERS)
    return ({"workers": (workers, f"one per CPU core, {cores} cores" + (
                f" (at most {MAX_CPU_WORKERS})" if cores > MAX_CPU_WORKERS else "")),
             "batch_size": (1, "a CPU gains no throughput from batching"),
             "max_batch_delay_ms": (CPU_BATCH_DELAY_MS, "unused at batch size 1")},
            "cpu", f"CPU only, {cores} cores: a worker per core (at most {MAX_CPU_WORKERS}), no batching")
