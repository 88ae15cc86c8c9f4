"""What reduced precisions were asked for, and whether this machine can build and gate them: the command line
makes the request and checks it once, before any work; export.precision.variants builds the kinds it names."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from contract.records import CLASSIFICATION
from export.errors import ExportError
from export.forms import kinds
from export.precision.calibration import DEFAULT_CALIBRATION_SAMPLES
from export.precision.gate import GATE_ENFORCE
from runtime.machine import BF16_FLAGS, MachineProfile, cpu_flags

PRECISIONS = kinds.precisions()
DEFAULT_PRECISIONS = (kinds.FP32,)
AUTO_PRECISION = "auto"  # --precision's default: the target's precisions for a trained classifier, else fp32


class PrecisionError(ExportError):
    """A precision cannot be built as asked (unknown name, no GPU for fp16, no image contract)."""


@dataclass(frozen=True)
class PrecisionRequest:
    precisions: tuple[str, ...] = DEFAULT_PRECISIONS
    calibration: Path | None = None
    validation: Path | None = None
    calibration_samples: int = DEFAULT_CALIBRATION_SAMPLES
    gate: str = GATE_ENFORCE  # one of export.precision.gate.GATE_MODES
    loader_workers: int | None = None
    target_flags: frozenset | None = None  # --target's CPU flags: int8 weights it must run exactly (None: this CPU)
    automatic: bool = False  # the tool chose the precisions (--precision auto): built only where a gate can judge

    @property
    def wanted(self) -> bool:
        return any(p != kinds.FP32 for p in self.precisions)

    @property
    def variant_kinds(self) -> list[str]:
        """The variant kinds the requested precisions make here, in table order."""
        return self.kinds_to_build()

    def kinds_to_build(self, flags: set[str] | frozenset[str] | None = None, task: str = CLASSIFICATION) -> list[str]:
        """The variant kinds the requested precisions make for a `task`'s model on a CPU with `flags` (default: read
        here)."""
        left_out = self.left_out(flags, task)
        return [name for name in self._requested_kinds(task) if name not in left_out]

    def left_out(self, flags: set[str] | frozenset[str] | None = None, task: str = CLASSIFICATION) -> dict[str, str]:
        """The kinds of the requested precisions not built here (this CPU's `flags`; default: read here), with why."""
        return {name: why for name in self._requested_kinds(task)
                if (why := left_out_here(kinds.get(name), self.target_flags, flags))}

    def _requested_kinds(self, task: str) -> list[str]:
        return [k.name for k in kinds.all_kinds() if k.is_variant and k.precision in self.precisions and k.task == task]


def parse_precisions(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(part.strip().lower() for part in text.split(",") if part.strip()))
    unknown = [n for n in names if n not in PRECISIONS]
    if unknown or not names:
        raise PrecisionError(f"--precision {text!r}: choose from {', '.join(PRECISIONS)}, comma-separated "
                             "(e.g. fp32,int8)")
    if kinds.FP32 not in names:
        raise PrecisionError(f"--precision {text!r} must include fp32: it is the reference every variant is "
                             "gated against and the fallback that is always servable (e.g. fp32,int8)")
    return names


def target_precisions(target: MachineProfile, device: str,
                      flags: frozenset[str] | None = None) -> tuple[tuple[str, ...], dict[str, str]]:
    """--precision target: fp32 and every precision with a kind fast on the target that this machine (its CPU's
    `flags`; default: read here) can build and gate (a bf16 form is gated only where the CPU computes in bf16);
    and why each precision fast on the target is left out."""
    fast = [p for p in kinds.precisions() if p == kinds.FP32 or any(
        k.runs_on.unmet(target) is None and k.fast_on.unmet(target) is None for k in kinds.variants(p))]
    left_out = {p: why for p in fast if (why := hardware_refusal(p, device, flags))}
    return tuple(p for p in fast if p not in left_out), left_out


def check_hardware(precisions: tuple[str, ...], device: str, flags: set[str] | frozenset[str] | None = None) -> None:
    """Refuse, before any work, a variant this machine (its CPU's `flags`; default: read here) cannot build and
    gate at a useful speed."""
    for precision in precisions:
        why = hardware_refusal(precision, device, flags)
        if why:
            raise PrecisionError(why)


def hardware_refusal(precision: str, device: str, flags: set[str] | frozenset[str] | None = None) -> str | None:
    """Why this machine cannot build and gate `precision` at a useful speed, or None when it can."""
    on_gpu = device.startswith("cuda")
    if precision == "fp16" and not on_gpu:
        return ("fp16 variants are for GPUs and are gated on one: add --device cuda, or leave fp16 out of "
                "--precision on a CPU-only machine")
    if precision == "bf16" and not on_gpu and not cpu_has_native_bf16(flags):
        return ("bf16 on this CPU would be emulated: it has no native bf16 (" + " / ".join(BF16_FLAGS) + "), and "
                "emulated bf16 is many times slower than fp32 (docs/results/2026-11-23-precision-ladder/); use int8 on this machine, or "
                "export bf16 where the CPU has it (or on a GPU with --device cuda)")
    return None


def left_out_here(kind, target_flags: frozenset | None = None,
                  flags: set[str] | frozenset[str] | None = None) -> str | None:
    """Why a kind of a requested precision is not built, or None. One that runs in a precision the request did not
    name (int8 with its remainder in bf16) is built only where both this machine, which gates it, and the target
    (`target_flags`; None: this machine) are fast with it, as --precision builds bf16 only where it is native."""
    if not kind.runs_beyond_its_precision:
        return None
    here = MachineProfile("this CPU", frozenset(cpu_flags() if flags is None else flags))
    target = here if target_flags is None else MachineProfile("the --target machine", frozenset(target_flags))
    for machine in dict.fromkeys((here, target)):
        why = kind.fast_on.unmet(machine)
        if why:
            return (f"it runs its {kind.precision} file's remainder in {kind.run_precision}, not fast on {machine.name} "
                    f"({why})")
    return None


def cpu_has_native_bf16(flags: set[str] | frozenset[str] | None = None) -> bool:
    flags = cpu_flags() if flags is None else flags
    return any(feature in flags for feature in BF16_FLAGS)


def automatic_skip_reason(request: PrecisionRequest, weights_kind: str, image_model: bool) -> str | None:
    """Why the precisions the tool chose (--precision auto) are not built for this model, or None: a gate can judge
    only a classifier's answers (an image contract to calibrate and check on) from trained weights."""
    if not request.automatic:
        return None
    if not image_model:
        return "the accuracy gate judges a classifier's answers; this model has none (--precision names precisions)"
    if weights_kind == "random":
        return ("random weights: no gate can judge them (their top-1 is decided by near ties); --precision target "
                "builds the target's precisions anyway")
    return None


def sources_to_build(request: PrecisionRequest, formats_given: bool, skipped: str | None) -> tuple[str, ...]:
    """The off-by-default fp32 kinds that --precision auto's variants are made from (the OpenVINO IR, for its int8
    and bf16), when the user named no --formats, the tool builds variants (`skipped` None), and OpenVINO is
    installed."""
    if formats_given or not request.automatic or skipped:
        return ()
    wanted = {source for kind in map(kinds.get, request.variant_kinds) for source in kind.sources
              if kinds.get(source).off_by_default and not kinds.get(source).for_devices}
    return tuple(sorted(kind for kind in wanted if kinds.get(kind).format != kinds.OPENVINO or _installed("openvino")))


def _installed(package: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(package) is not None
