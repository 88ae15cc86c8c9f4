"""A classifier's comparator: how a candidate's classes agree with a reference's.

On logits (agreement_metrics, pure functions of two (N, classes) tensors): the accuracy gate
(export.precision.gate) compares a reduced-precision variant with fp32 eager; the decode check
(export.checks.decode) the served artifact on draft-decoded images with itself on exactly decoded ones. Both count
top-1 agreement where the reference is confident, top-5 agreement and the logit error relative to the reference's
spread, so a figure reads the same for any model. On served answers (compare_ranked): the rollout's two versions'
ranked labels, the photo's evidence being a reference confident enough for its top-1 to mean something.
"""

from __future__ import annotations

import math

import torch

from gates.verdict import LIVE_AND_CANDIDATE, Sides, Verdict

# Top-1 agreement is counted where fp32 is confident: its best class ahead of the second by at least 5
# probability points. Revisited with a real model (EfficientNet-Lite0, measured: docs/results/2026-11-24-int8-efficientnet-lite0/): on
# the default held-out images (photo crops and generated images are not ImageNet classes) fp32's margins are
# mostly small, and the images flipped by an int8 that is otherwise faithful all had margins below this one: a
# flip there measures a tie, not the quantization. What this lets through:
# an int8 that reorders classes fp32 itself nearly ties on; top-5 agreement, the logit error and the labelled
# accuracy drop are still counted on every image, so it does not let through a variant that is wrong where it
# matters (lite0's plain int8 still fails it).
CONFIDENT_MARGIN = 0.05


def agreement_metrics(reference: torch.Tensor, candidate: torch.Tensor) -> dict:
    """The reference's logits (fp32) vs the candidate's, (N, classes) each."""
    reference, candidate = reference.double(), candidate.double()
    if reference.shape != candidate.shape or reference.dim() != 2:
        raise ValueError(f"logits must both be (N, classes): {tuple(reference.shape)} vs {tuple(candidate.shape)}")
    fp32_top1 = reference.argmax(dim=1)
    k = min(5, reference.shape[1])
    error = (candidate - reference).abs()
    spread = reference.std(dim=1).mean().clamp_min(1e-12)
    finite = bool(torch.isfinite(candidate).all())
    agree = candidate.argmax(dim=1) == fp32_top1
    confident = confident_rows(reference)
    return {
        "top1_agreement": agree.double().mean().item(),
        "confident_images": int(confident.sum()),
        "top1_agreement_confident": agree[confident].double().mean().item() if confident.any() else math.nan,
        "top5_agreement": (candidate.topk(k, dim=1).indices == fp32_top1[:, None]).any(dim=1).double().mean().item(),
        "mean_logit_error": error.mean().item() if finite else math.inf,
        "max_logit_error": error.max().item() if finite else math.inf,
        "fp32_logit_spread": spread.item(),
        "relative_logit_error": (error.mean() / spread).item() if finite else math.inf,
    }


def confident_rows(reference: torch.Tensor) -> torch.Tensor:
    """Rows where fp32's top-1 probability exceeds its second by CONFIDENT_MARGIN or more."""
    if reference.shape[1] < 2:
        return torch.ones(reference.shape[0], dtype=torch.bool)
    best_two = reference.softmax(dim=1).topk(2, dim=1).values
    return (best_two[:, 0] - best_two[:, 1]) >= CONFIDENT_MARGIN


def compare_ranked(reference: dict, candidate: dict, min_top5_overlap: int, confident_probability: float,
                   sides: Sides = LIVE_AND_CANDIDATE) -> Verdict:
    """Two served answers' ranked predictions: they agree when the top-1 is the same and the candidate keeps at
    least min_top5_overlap of the reference's top-5; the photo is evidence when the reference's top-1 probability
    reaches confident_probability (below it, the top-1 is a near tie any retraining may flip, or noise)."""
    ours, theirs = reference["predictions"], candidate["predictions"]
    if not ours or not theirs:
        return Verdict(False, f"{sides.reference} names {len(ours)} classes, {sides.candidate} {len(theirs)}",
                       evidence=bool(ours))
    ours_top5, theirs_top5 = [p["label"] for p in ours[:5]], [p["label"] for p in theirs[:5]]
    kept = len(set(ours_top5) & set(theirs_top5))
    agrees = ours_top5[0] == theirs_top5[0] and kept >= min(min_top5_overlap, len(ours_top5))
    confidence = float(ours[0].get("probability", 0.0))
    top1 = (f"top-1 {ours_top5[0]} on both" if ours_top5[0] == theirs_top5[0]
            else f"top-1 {theirs_top5[0]} on {sides.candidate}, {ours_top5[0]} on {sides.reference}")
    return Verdict(agrees, f"{top1} ({sides.reference} {confidence:.0%} sure); {sides.candidate} keeps {kept} of "
                           f"{sides.reference}'s top-5", evidence=confidence >= confident_probability)
