"""The decode check: what draft decoding (runtime.images, libjpeg's DCT scaling) changes, measured at export on
phone-sized photographs with the artifact that will be served, and gated.

For each image, the served artifact runs on the exact tensor (every pixel decoded, as weights.transforms()
sees it) and on the draft one. Recorded in the manifest (`decode_check`) and decided there: the contract's
`decode` is "draft" only when every check below passed, "exact" otherwise (or when --decode exact asks).

The images: DECODE_CHECK_PHOTOS from scikit-image, made phone-like (export/checks/phone_photos.py: grain, JPEG
quality 90) at sizes chosen from the contract so that they are decoded at 1/2 or 1/4 scale (the reductions a
phone photo meets), half of them stored sideways with an EXIF orientation tag. The decoded tensors depend on
the contract only, so one process exporting several models with the same preprocessing makes them once.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from contract.records import ImageContract, Manifest, ServingDecision
from export.checks.phone_photos import phone_jpeg, upright_photo
from gates.topk import CONFIDENT_MARGIN, agreement_metrics, confident_rows
from runtime import RunOptions, open_artifact
from runtime.base import Backend
from runtime.images import decode_upright, draft_floor, preprocess

DECODE_CHECK_PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry",
                       "camera", "brick")
# The DCT reductions exercised and on how many of the photos: every photo at 1/2 (the reduction closest to the
# exact decode's detail), the first half again at 1/4 (a 12 MP phone photo's, several times the pixels to make
# and decode exactly, so fewer of them).
DRAFT_SCALES = {2: len(DECODE_CHECK_PHOTOS), 4: len(DECODE_CHECK_PHOTOS) // 2}
SIZE_MARGIN = 1.15  # each photo's shorter side is this much above the smallest one drafted at its scale
ASPECT = 4 / 3  # a phone camera's
PHOTO_SEED = 20
BATCH = 8


@dataclass(frozen=True)
class DecodeTolerance:
    """Draft decoding may change the served answer no more than this (policy values, reasons inline)."""

    # The decoded tensor, in 0..255 levels: a backstop against a wrong scale, offset or orientation (which
    # move most pixels by tens of levels), with room above what draft decoding changes on the check images
    # (grained phone-like photos sitting just above each reduction's threshold, where the resize left after
    # libjpeg's is smallest) and on the benchmark's phone photo (measured: docs/results/2026-11-24-serving-bench-photo-sizes/analysis.md).
    max_mean_levels: float = 2.0
    max_max_levels: float = 96.0
    # The logits, relative to their spread across classes (gates.topk's measure): int8's bound, well
    # above what draft decoding measured (docs/results/2026-11-24-serving-bench-photo-sizes/analysis.md; highest for random weights, whose logits barely
    # spread).
    max_relative_logit_error: float = 0.3
    # Answers, on the images where the exact decode's answer is confident (top-1 ahead of the second by
    # CONFIDENT_MARGIN): draft gives the same class, and the exact class is in draft's top 5. On a tie (any
    # random-weight model) a flip measures the tie, not the decoder, so those images count in the logit error only.
    min_top1_agreement_confident: float = 1.0
    min_top5_agreement_confident: float = 1.0


DECODE_TOLERANCE = DecodeTolerance()


@dataclass
class DecodeCheck:
    passed: bool
    decode: str  # the mode the contract records: "draft" when passed, else "exact"
    images: list = field(default_factory=list)  # what each image was: source photo, stored size, scale
    metrics: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)
    tolerance: dict = field(default_factory=lambda: asdict(DECODE_TOLERANCE))

    def as_dict(self) -> dict:
        """JSON-ready: a metric that was not counted (NaN: no confident image) is null."""
        record = asdict(self)
        record["metrics"] = {k: None if isinstance(v, float) and v != v else v for k, v in self.metrics.items()}
        return record

    def line(self) -> str:
        m = self.metrics
        head = (f"decode check ({len(self.images)} phone-sized JPEGs, served artifact): draft vs exact tensor "
                f"mean {m['mean_levels']:.2f} max {m['max_levels']:.0f} levels, top-1 agreement "
                f"{_pct(m['top1_agreement'])} ({_pct(m['top1_agreement_confident'])} of "
                f"{m['confident_images']} confident), top-5 {_pct(m['top5_agreement'])} "
                f"({_pct(m['top5_agreement_confident'])} of confident), logit error "
                f"{m['relative_logit_error']:.3f} of the spread")
        return f"{head} -> serving {self.decode}" + (f" ({'; '.join(self.failures)})" if self.failures else "")


def record_decode_check(folder: Path, manifest: Manifest, serving: ServingDecision, device: str, decode: str,
                        step: Callable[[str], None]) -> None:
    """Measure draft decoding with the artifact to be served (in `folder`) and record the contract's decode
    mode; `decode` is --decode (exact: not measured)."""
    contract = manifest.input.preprocessing
    if contract is None or serving.served is None:
        return
    if decode == "exact":
        manifest.decode_check = {"skipped": "--decode exact: every pixel decoded"}
        manifest.input.preprocessing = replace(contract, decode="exact")
        return
    record = manifest.artifacts[serving.served]
    backend = open_artifact(record.format, folder / record.path,
                            RunOptions(device=device, precision=record.run_precision), name=record.kind)
    check = run_decode_check(backend, replace(contract, decode="draft"))
    manifest.decode_check = check.as_dict()
    manifest.input.preprocessing = replace(contract, decode=check.decode)
    step(check.line())


def check_images(contract: ImageContract) -> list[tuple[bytes, dict]]:
    """The phone-like JPEGs for this contract, with what each one is."""
    floor = draft_floor(contract, "draft")
    rng = np.random.default_rng(PHOTO_SEED)
    images = []
    for scale, count in DRAFT_SCALES.items():
        for index, photo in enumerate(DECODE_CHECK_PHOTOS[:count]):
            short = round(scale * floor * SIZE_MARGIN)
            sideways = (index + scale) % 2 == 1
            shown = (short, round(short * ASPECT)) if sideways else (round(short * ASPECT), short)
            data = phone_jpeg(upright_photo(photo, shown, rng), sideways=sideways)
            images.append((data, {"photo": f"skimage.data.{photo}", "shown": list(shown), "sideways": sideways,
                                  "draft_scale": f"1/{scale}"}))
    return images


def run_decode_check(backend: Backend, contract: ImageContract) -> DecodeCheck:
    """Every check, on the served artifact (contract: the one to serve, decode set to draft); failures name the
    number and its bound."""
    exact, draft, images = check_tensors(contract)
    levels = (draft - exact).abs() * 255
    reference, candidate = _logits(backend, exact), _logits(backend, draft)
    metrics = agreement_metrics(reference, candidate)
    metrics.update(mean_levels=levels.mean().item(), max_levels=levels.max().item(), confident_margin=CONFIDENT_MARGIN,
                   top5_agreement_confident=top5_where_confident(reference, candidate))
    failures = judge(metrics)
    return DecodeCheck(not failures, "exact" if failures else "draft", list(images), metrics, failures)


@functools.lru_cache(maxsize=2)
def check_tensors(contract: ImageContract) -> tuple[torch.Tensor, torch.Tensor, tuple[dict, ...]]:
    """The check images decoded exactly and in draft, preprocessed: (N, 3, crop) each, and what each image is."""
    images = check_images(contract)
    floor = draft_floor(contract, "draft")
    exact = torch.stack([preprocess(decode_upright(data), contract) for data, _ in images])
    draft = torch.stack([preprocess(decode_upright(data, floor), contract) for data, _ in images])
    return exact, draft, tuple(info for _, info in images)


def judge(metrics: dict, tolerance: DecodeTolerance = DECODE_TOLERANCE) -> list[str]:
    failures = []
    if metrics["mean_levels"] > tolerance.max_mean_levels:
        failures.append(f"mean tensor change {metrics['mean_levels']:.2f} levels > {tolerance.max_mean_levels:g}")
    if metrics["max_levels"] > tolerance.max_max_levels:
        failures.append(f"max tensor change {metrics['max_levels']:.0f} levels > {tolerance.max_max_levels:g}")
    if not metrics["relative_logit_error"] <= tolerance.max_relative_logit_error:
        failures.append(f"logit error {metrics['relative_logit_error']:.3f} of the spread > "
                        f"{tolerance.max_relative_logit_error:g}")
    confident = metrics["top1_agreement_confident"]
    if metrics["confident_images"] and confident < tolerance.min_top1_agreement_confident:
        failures.append(f"top-1 agreement on confident images {_pct(confident)} < "
                        f"{_pct(tolerance.min_top1_agreement_confident)}")
    top5 = metrics["top5_agreement_confident"]
    if metrics["confident_images"] and top5 < tolerance.min_top5_agreement_confident:
        failures.append(f"top-5 agreement on confident images {_pct(top5)} < "
                        f"{_pct(tolerance.min_top5_agreement_confident)}")
    return failures


def top5_where_confident(reference: torch.Tensor, candidate: torch.Tensor) -> float:
    """Share of the confident images whose exact top-1 class is in the candidate's top 5 (NaN: none confident)."""
    confident = confident_rows(reference)
    k = min(5, reference.shape[1])
    hits = (candidate.topk(k, dim=1).indices == reference.argmax(dim=1)[:, None]).any(dim=1)
    return hits[confident].double().mean().item() if confident.any() else math.nan


def _logits(backend: Backend, rows: torch.Tensor) -> torch.Tensor:
    return torch.cat([backend(rows[i:i + BATCH]).float() for i in range(0, len(rows), BATCH)])


def _pct(value: float) -> str:
    return "n/a" if value != value else f"{100 * value:.1f} %"
