"""Hold every artifact to eager PyTorch: same inputs, its kind's tolerance (export.forms.tolerances), and all the
error statistics.

In the spirit of Polygraphy's comparator: an output passes when |candidate - eager| <= atol + rtol * |eager|
element-wise. The metrics also say how close it came (the smallest atol / rtol that would have passed).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

from export.checks.detections import compare_sets
from export.errors import ParityError
from export.forms.tolerances import SetTolerance, Tolerance
from runtime.base import ArtifactRunError, Backend, Outputs

OTHER_SPATIAL_SIZE = (320, 288)  # non-square, not the default: exercises the in-graph resize
TOPK = (1, 5)


@dataclass
class InputBatch:
    name: str
    tensor: torch.Tensor
    default_size: bool = True  # False: only for artifacts that claim to accept other sizes


@dataclass
class Comparison:
    artifact: str
    inputs: str
    shape: list[int]
    metrics: dict
    tolerance: Tolerance
    passed: bool

    def as_dict(self) -> dict:
        return {**asdict(self), "tolerance": asdict(self.tolerance)}


@dataclass
class ParityReport:
    comparisons: list[Comparison] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    # kind -> where a failing form first diverges (export.divergence: markdown(), as_dict(), line()), or why no
    # report could be made
    divergence: dict = field(default_factory=dict)

    def divergence_lines(self) -> list[str]:
        return [d if isinstance(d, str) else d.line() for d in self.divergence.values()]

    @property
    def failures(self) -> list[Comparison]:
        return [c for c in self.comparisons if not c.passed]

    def passed(self, artifact: str) -> bool:
        mine = [c for c in self.comparisons if c.artifact == artifact]
        return bool(mine) and all(c.passed for c in mine)

    def summary(self) -> dict[str, dict]:
        out = {}
        for artifact in dict.fromkeys(c.artifact for c in self.comparisons):
            mine = [c for c in self.comparisons if c.artifact == artifact]
            out[artifact] = {
                "passed": all(c.passed for c in mine),
                "max_abs": max(c.metrics["max_abs"] for c in mine),
                "max_rel": _max_or_none(c.metrics.get("max_rel") for c in mine),
                "min_cosine": _min_or_none(c.metrics.get("cosine") for c in mine),
                "top1_agreement": _min_or_none(c.metrics.get("top1_agreement") for c in mine),
                "top5_agreement": _min_or_none(c.metrics.get("top5_agreement") for c in mine),
                "tolerance": asdict(mine[0].tolerance),
                "inputs": len(mine),
            }
        return out

    def as_dict(self) -> dict:
        return {"summary": self.summary(), "comparisons": [c.as_dict() for c in self.comparisons],
                "skipped": self.skipped,
                "divergence": {k: d if isinstance(d, str) else d.as_dict() for k, d in self.divergence.items()}}

    def table(self) -> str:
        return render_table(self.comparisons)

    def unrunnable(self) -> dict[str, Comparison]:
        """artifact -> its first comparison whose input its runtime refused to run (an error, not numbers)."""
        found: dict[str, Comparison] = {}
        for c in self.comparisons:
            if "traceback" in c.metrics:
                found.setdefault(c.artifact, c)
        return found

    def drop(self, artifact: str) -> None:
        """Forget an artifact that left the export (refused): its comparisons and skips."""
        self.comparisons = [c for c in self.comparisons if c.artifact != artifact]
        self.skipped.pop(artifact, None)

    def raise_on_failure(self) -> None:
        if self.failures:
            raise ParityError(self.failures, render_table(self.failures), self.divergence_lines())


def _min_or_none(values):
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _max_or_none(values):
    present = [v for v in values if v is not None]
    return max(present) if present else None


# ---------------------------------------------------------------- inputs

def structured_images(count: int, channels: int, height: int, width: int, seed: int = 0) -> torch.Tensor:
    """Photo-like images in [0, 1]: gradients, shapes on backgrounds, and noise at several scales."""
    generator = torch.Generator().manual_seed(seed)
    ys = torch.linspace(0, 1, height).view(height, 1).expand(height, width)
    xs = torch.linspace(0, 1, width).view(1, width).expand(height, width)
    images = []
    for index in range(count):
        kind = index % 4
        if kind == 0:  # colour gradients
            planes = [(xs * (c + 1) / channels + ys * (channels - c) / channels) / 2 for c in range(channels)]
            image = torch.stack(planes)
        elif kind == 1:  # a disc and a rectangle on a flat background
            image = torch.rand(channels, 1, 1, generator=generator).expand(channels, height, width).clone()
            cy, cx, r = torch.rand(3, generator=generator) * torch.tensor([1.0, 1.0, 0.3]) + torch.tensor([0, 0, 0.1])
            disc = ((ys - cy) ** 2 + (xs - cx) ** 2) < r ** 2
            image[:, disc] = torch.rand(channels, 1, generator=generator)
            image[:, height // 4: height // 2, width // 2: 3 * width // 4] = torch.rand(channels, 1, 1, generator=generator)
        elif kind == 2:  # checkerboard with soft edges
            period = 4 + index % 13
            checker = ((torch.arange(height) // period).view(-1, 1) + (torch.arange(width) // period).view(1, -1)) % 2
            image = checker.float().expand(channels, height, width) * 0.8 + 0.1
        else:  # multi-scale noise: coarse blobs + mid texture + fine grain
            image = torch.zeros(channels, height, width)
            for cells, weight in ((4, 0.5), (16, 0.3), (max(height, 1), 0.2)):
                coarse = torch.rand(1, channels, cells, cells, generator=generator)
                image += weight * F.interpolate(coarse, size=(height, width), mode="bilinear",
                                                align_corners=False)[0]
        images.append(image.clamp(0, 1))
    return torch.stack(images)


def parity_inputs(example_shape: tuple[int, ...], value_range=(0.0, 1.0), seed: int = 0,
                  spatial_dynamic: bool = False, dynamic_batch: bool = True) -> list[InputBatch]:
    """Seeded random inputs in the model's range and structured images, at batch 1, 2 and 8 (one image each
    for a model that takes one)."""
    generator = torch.Generator().manual_seed(seed)
    low, high = value_range
    item = tuple(example_shape[1:])

    def random(batch, shape=item):
        return low + (high - low) * torch.rand((batch,) + tuple(shape), generator=generator)

    def structured(batch, shape=item):
        if len(shape) != 3:
            return random(batch, shape)
        return low + (high - low) * structured_images(batch, *shape, seed=seed + batch)

    if dynamic_batch:
        batches = [InputBatch("random b1", random(1)), InputBatch("structured b2", structured(2)),
                   InputBatch("mixed b8", torch.cat([random(4), structured(4)]))]
    else:
        batches = [InputBatch("random", random(1)), InputBatch("structured", structured(1)),
                   InputBatch("structured, another", structured(4)[3:])]
    if spatial_dynamic and len(item) == 3:
        rows = 2 if dynamic_batch else 1
        other = (item[0],) + OTHER_SPATIAL_SIZE
        batches.append(InputBatch(f"structured b{rows} @{other[1]}x{other[2]}", structured(rows, other),
                                  default_size=False))
    return batches


# ---------------------------------------------------------------- metrics

def compare_outputs(reference: Outputs, candidate: Outputs, tolerance: Tolerance | SetTolerance) -> tuple[dict, bool]:
    """Metrics and the verdict of one candidate output against eager's, as its tolerance says to compare them:
    element-wise (a Tolerance), or as sets of boxes (a SetTolerance: a detector)."""
    if isinstance(tolerance, SetTolerance):
        return compare_sets(reference, candidate, tolerance)
    if reference.shape != candidate.shape:
        return {"error": f"shape {tuple(candidate.shape)} != eager {tuple(reference.shape)}",
                "max_abs": math.inf, "max_rel": math.inf, "cosine": -1.0}, False
    return elementwise(reference.detach().cpu(), candidate.detach().cpu(), tolerance)


def elementwise(reference: torch.Tensor, candidate: torch.Tensor, tolerance: Tolerance) -> tuple[dict, bool]:
    """Every figure in float64, as plain torch computes it, but each step once and in place over three buffers
    this function owns (a segmenter's outputs are hundreds of MB): the order of the steps matters."""
    ref, cand = _float64_copy(reference), _float64_copy(candidate)
    diff = torch.sub(cand, ref).abs_()
    max_abs = diff.max().item()
    mean_abs = diff.mean().item()
    agreement = {f"top{k}_agreement": topk_agreement(ref, cand, k) for k in TOPK}
    if ref.dim() == 4:  # per-pixel class scores (a segmenter): how many pixels get the same class
        # max(dim).indices is argmax(dim) (the first maximum; NaN counts as the maximum) by a faster kernel
        agreement["pixel_agreement"] = (ref.max(1).indices == cand.max(1).indices).double().mean().item()
    cosine = _cosine_in_place(ref, cand)
    magnitude = ref.copy_(reference).abs_()  # |eager| in the buffer the cosine is done with
    figures, passed = _tolerance_figures(diff, magnitude, cand, tolerance)
    median_abs = math.nan if math.isnan(max_abs) else _median_in_place(diff)
    metrics = {"max_abs": max_abs, "mean_abs": mean_abs, "median_abs": median_abs, "max_rel": figures.pop("max_rel"),
               "cosine": cosine, **figures}
    # a non-finite candidate makes its diff non-finite: only then is the candidate itself searched
    if not math.isfinite(max_abs) and not torch.isfinite(candidate).all():
        metrics["error"] = "non-finite values in the artifact's output"
    metrics.update(agreement)
    return metrics, "error" not in metrics and passed


def _tolerance_figures(diff: torch.Tensor, magnitude: torch.Tensor, scratch: torch.Tensor,
                       tolerance: Tolerance) -> tuple[dict, bool]:
    """max rel, the smallest atol (rtol) that would have passed with the other held at its setting, and whether
    every element is within atol + rtol * |eager|. `magnitude` (|eager|) and `scratch` are overwritten. Clamping
    at 0 after the max gives the max of the clamped values (NaN propagates through both)."""
    bound = torch.mul(magnitude, tolerance.rtol, out=scratch).add_(tolerance.atol)
    passed = bool(torch.le(diff, bound).all())
    slack = torch.sub(diff, torch.mul(magnitude, tolerance.rtol, out=scratch), out=scratch)
    required_atol = slack.max().clamp_min(0).item()
    floor = magnitude.clamp_min_(1e-12)
    max_rel = torch.div(diff, floor, out=scratch).max().item()
    required_rtol = torch.sub(diff, tolerance.atol, out=scratch).div_(floor).max().clamp_min(0).item()
    return {"max_rel": max_rel, "required_atol": required_atol, "required_rtol": required_rtol}, passed


def _float64_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A float64 tensor of the same values and layout (the sums' order follows it) that the caller does not
    share (.double() returns a float64 tensor as it is)."""
    return tensor.to(torch.float64, copy=True)


def _cosine_in_place(x: torch.Tensor, y: torch.Tensor) -> float:
    """F.cosine_similarity(x.flatten(), y.flatten(), dim=0, eps=1e-12), its very steps (each divided by its
    norm, multiplied, summed) done in place: x and y are overwritten."""
    x, y = x.flatten(), y.flatten()  # views of contiguous buffers, copies in eager's element order otherwise
    x.div_(torch.linalg.vector_norm(x, 2, dim=0, keepdim=True).clamp_min_(1e-12))
    y.div_(torch.linalg.vector_norm(y, 2, dim=0, keepdim=True).clamp_min_(1e-12))
    return x.mul_(y).sum(0).item()


def _median_in_place(values: torch.Tensor) -> float:
    """torch.median of values without NaN (the lower median) by a partition in place: `values` is reordered."""
    array = values.flatten().numpy()
    middle = (array.size - 1) // 2
    array.partition(middle)
    return float(array[middle])


def topk_agreement(reference: torch.Tensor, candidate: torch.Tensor, k: int) -> float | None:
    """Fraction of rows whose top-k class sets are identical (order-insensitive); None if not (N, classes)."""
    if reference.dim() != 2 or reference.shape[1] < k:
        return None
    ref_top = reference.topk(k, dim=1).indices.sort(dim=1).values
    cand_top = candidate.topk(k, dim=1).indices.sort(dim=1).values
    return (ref_top == cand_top).all(dim=1).double().mean().item()


# ---------------------------------------------------------------- running

@dataclass(frozen=True)
class UnderTest:
    """An opened artifact under test, the tolerance its kind is held to, and whether it claims other sizes."""

    runner: Backend
    tolerance: Tolerance
    spatial_dynamic: bool


def run_parity(eager: Backend, candidates: dict[str, UnderTest], inputs: list[InputBatch]) -> ParityReport:
    report = ParityReport()
    for batch in inputs:
        expected = eager(batch.tensor)
        for name, candidate in candidates.items():
            if not batch.default_size and not candidate.spatial_dynamic:
                report.skipped.setdefault(name, "fixed input size: other sizes are not claimed")
                continue
            try:
                metrics, passed = compare_outputs(expected, candidate.runner(batch.tensor), candidate.tolerance)
            except ArtifactRunError as error:  # the artifact's runtime refused the input: a failure, with its cause
                metrics, passed = {"error": str(error)[:300], "traceback": error.cause_traceback(),
                                   "max_abs": math.inf, "max_rel": math.inf, "cosine": -1.0}, False
            report.comparisons.append(Comparison(name, batch.name, list(batch.tensor.shape), metrics,
                                                 candidate.tolerance, passed))
    return report


def render_table(comparisons: list[Comparison]) -> str:
    header = ("| artifact | inputs | max abs | mean abs | median abs | max rel | cosine | top-1 | top-5 "
              "| tolerance | needed atol / rtol | result |")
    lines = [header, "|" + "---|" * 12]
    for c in comparisons:
        m = c.metrics
        result = "pass" if c.passed else "FAIL" + (f" ({m['error']})" if "error" in m else "")
        if c.passed and "boxes" in m:  # sets of boxes: how many, and how many were matched
            result += f" ({m['boxes']} boxes, {m['matched']} matched, {m['at_edge']} at the edge)"
        lines.append(
            f"| {c.artifact} | {c.inputs} | {_g(m['max_abs'])} | {_g(m.get('mean_abs'))} | {_g(m.get('median_abs'))} "
            f"| {_g(m['max_rel'])} | {_cos(m['cosine'])} | {_pct(m.get('top1_agreement'))} "
            f"| {_pct(m.get('top5_agreement'))} | {c.tolerance.describe()} "
            f"| {_g(m.get('required_atol'))} / {_g(m.get('required_rtol'))} | {result} |")
    return "\n".join(lines)


def _g(value) -> str:
    return "-" if value is None else f"{value:.2e}"


def _cos(value) -> str:
    return "-" if value is None else f"{value:.7f}"


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def report_markdown(report: ParityReport, title: str) -> str:
    summary = report.summary()
    lines = [f"# Parity: {title}", "",
             "Each artifact against eager PyTorch on the same inputs. Pass: |artifact - eager| <= atol + rtol*|eager|.",
             "", "| artifact | result | worst max abs | worst max rel | min cosine | top-1 | top-5 |",
             "|---|---|---|---|---|---|---|"]
    for name, s in summary.items():
        lines.append(f"| {name} | {'pass' if s['passed'] else 'FAIL'} | {_g(s['max_abs'])} | {_g(s['max_rel'])} "
                     f"| {_cos(s['min_cosine'])} | {_pct(s['top1_agreement'])} | {_pct(s['top5_agreement'])} |")
    lines += ["", "## Every comparison", "", report.table(), ""]
    for name, why in report.skipped.items():
        lines.append(f"- {name}: other input sizes skipped ({why})")
    if report.divergence:
        lines += ["", "## Where each failing form diverges", "",
                  "Eager and the form on the first input it failed, every module's output kept and matched "
                  "(python -m export explain; docs/results/2026-11-25-divergence-report/).", ""]
        lines += [d if isinstance(d, str) else d.markdown() for d in report.divergence.values()]
    return "\n".join(lines) + "\n"


def report_json(report: ParityReport) -> str:
    return json.dumps(report.as_dict(), indent=2, default=str)
