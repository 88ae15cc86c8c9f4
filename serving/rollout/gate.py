"""The agreement gate: the live version and the candidate answer the same photos over real HTTP, the task's
comparator (gates/) judges each pair against the declared thresholds, and the gate counts the photos that carried
evidence: a vacuous agreement (two detectors that find nothing on photos of nothing) proves nothing.

The photos are a folder of the model's own domain (--photos DIR), else those the candidate's archive carries (python
-m export --holdout-photos DIR), else the built-in held-out photographs (gates.photos, whole and cropped, sent as PNG
as a client sends them); or live requests (--shadow). The gate's report names which. A classifier's pair agrees
when the candidate's top-1 is the live top-1 and it keeps most of its top-5, and is evidence when the live version
is confident; a detector's when its boxes match the live set, evidence when either finds a box; a segmenter's when
every class's mask overlaps the live mask, evidence when either finds foreground. What disagrees is named: the
photo and how, in the two versions' names ("v3 finds 2 boxes v2 does not").
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from contract.records import CLASSIFICATION, DETECTION, SEGMENTATION
from gates.verdict import Sides, Verdict
from handlers.request_body import TOPK_HEADER, option_header
from serving.rollout.candidate import Candidate, carried_photos

# Photos asked at once, each of both versions together: a few requests beside the live traffic, which waits
# behind them no longer than behind a few more clients, instead of twenty round trips one after another
GATE_PHOTOS_AT_ONCE = 2

# Declared thresholds: the share of photos that must agree, and what agreeing means per task. A retrained model
# may move near-ties; it may not change what most photos are.
MIN_AGREEING_SHARE = 0.9  # photos whose answers agree, over the photos that carried evidence
MIN_TOP5_OVERLAP = 3  # of the live top-5 labels, at least this many in the candidate's top-5
DETECTION_BOX_IOU = 0.9  # a candidate box matches a live one of the same label from this IoU
DETECTION_SCORE_ATOL = 0.05  # matched scores within this
MIN_MASK_IOU = 0.9  # each class's mask against the live one
PHOTO_COUNT = 10  # held-out photos sent to both versions: enough for a 0.9 share to mean one disagreement
# Evidence: a classifier's photo counts where the live version's top-1 probability reaches this (a trained model
# is sure of what a photo shows; a random-weights one spreads its probability over every class), and the gate
# judges only from this many photos with evidence.
CONFIDENT_PROBABILITY = 0.5
MIN_EVIDENCE_PHOTOS = 3



def comparator(task: str) -> Callable[..., Verdict]:
    """The task's rule: (live answer, candidate answer, sides=) -> Verdict. Imported when a gate runs, so that the
    rollout's other commands (a refusal, a rollback, `versions`) start without torch and torchvision."""
    if task == CLASSIFICATION:
        from gates.topk import compare_ranked
        return functools.partial(compare_ranked, min_top5_overlap=MIN_TOP5_OVERLAP,
                                 confident_probability=CONFIDENT_PROBABILITY)
    if task == DETECTION:
        from gates.boxes import compare_served_boxes
        return functools.partial(compare_served_boxes, box_iou_min=DETECTION_BOX_IOU, score_atol=DETECTION_SCORE_ATOL)
    from gates.masks import compare_class_maps
    return functools.partial(compare_class_maps, min_mask_iou=MIN_MASK_IOU)

# What each task's gate asks for beyond the photo: a classifier's top-5, a segmenter's class map as PNG.
REQUEST_HEADERS = {CLASSIFICATION: {TOPK_HEADER: "5"}, DETECTION: {}, SEGMENTATION: {option_header("masks"): "png"}}


@dataclass
class Photos:
    """What both versions answer, and where it came from, in words (the gate's report says it)."""

    source: str
    items: list[tuple[str, bytes]]  # (name, the bytes a client sends)


@dataclass
class PhotoVerdict:
    photo: str
    verdict: Verdict

    @property
    def agrees(self) -> bool:
        return self.verdict.agrees


@dataclass
class GateResult:
    task: str
    live: str
    candidate: str
    source: str = ""  # where the photos came from (Photos.source)
    verdicts: list[PhotoVerdict] = field(default_factory=list)

    @property
    def evidence(self) -> int:
        """Photos that carried evidence: something for the two versions to agree on."""
        return sum(v.verdict.evidence for v in self.verdicts)

    @property
    def enough_evidence(self) -> bool:
        return self.evidence >= MIN_EVIDENCE_PHOTOS

    @property
    def share(self) -> float:
        """Photos that agree, over those that carried evidence (over all of them when none did)."""
        judged = [v for v in self.verdicts if v.verdict.evidence] or self.verdicts
        return sum(v.agrees for v in judged) / max(len(judged), 1)

    @property
    def agrees(self) -> bool:
        return bool(self.verdicts) and self.share >= MIN_AGREEING_SHARE

    @property
    def passed(self) -> bool:
        return self.agrees and self.enough_evidence

    def outcome(self) -> str:
        if not self.agrees:
            return "FAILED"
        return "passed" if self.enough_evidence else "TOO LITTLE EVIDENCE to judge"

    def table(self) -> str:
        width = max((len(v.photo) for v in self.verdicts), default=5)
        lines = [f"photos: {self.source}",
                 f"{'photo':<{width}}  agrees  evidence  {self.live} vs {self.candidate}",
                 *(f"{v.photo:<{width}}  {'yes' if v.agrees else 'NO':<6}  {'yes' if v.verdict.evidence else '-':<8}  "
                   f"{v.verdict.how}" for v in self.verdicts),
                 f"{len(self.verdicts)} photos, {self.evidence} with evidence ({describe_evidence(self.task)}; "
                 f"at least {MIN_EVIDENCE_PHOTOS} needed), {self.share:.0%} of them agree (threshold "
                 f"{MIN_AGREEING_SHARE:.0%}, {describe_rule(self.task)}): {self.outcome()}"]
        return "\n".join(lines)

    def disagreements(self) -> str:
        return "; ".join(f"{v.photo}: {v.verdict.how}" for v in self.verdicts if not v.agrees)

    def too_little_evidence(self) -> str:
        """Why the gate cannot judge, in the versions' names."""
        return (f"only {self.evidence} of the {len(self.verdicts)} photos carried evidence ({describe_evidence(self.task)}"
                f"; at least {MIN_EVIDENCE_PHOTOS} needed): {self.live} and {self.candidate} agreeing on them proves "
                "nothing")


def describe_rule(task: str) -> str:
    return {CLASSIFICATION: f"same top-1, >= {MIN_TOP5_OVERLAP} of the top-5 kept",
            DETECTION: f"boxes matched at IoU >= {DETECTION_BOX_IOU}, scores within {DETECTION_SCORE_ATOL}",
            SEGMENTATION: f"every class's mask IoU >= {MIN_MASK_IOU}"}[task]


def describe_evidence(task: str) -> str:
    return {CLASSIFICATION: f"the live version's top-1 at >= {CONFIDENT_PROBABILITY:.0%} probability",
            DETECTION: "a box found by either version",
            SEGMENTATION: "foreground found by either version"}[task]


def photos_for(given: int | Path | None, candidate: Candidate | None = None) -> Photos:
    """--photos DIR (read at once: it needs no candidate); else the held-out photos the candidate's archive carries;
    else the built-in held-out photographs. --photos N takes the first N of either."""
    from gates.photos import MAX_FOLDER_PHOTOS, folder_photos, held_out_photos  # decoders: only when photos are read
    if isinstance(given, Path):
        return Photos(f"--photos {given}", folder_photos(given, MAX_FOLDER_PHOTOS))
    # The candidate's, not the live's: they travel with the version under judgement, chosen by whoever exported it
    # for what it is meant to answer, so each version is judged on its own export's evidence, never on an older one.
    if candidate is not None and candidate.manifest.holdout_photos:
        carried = carried_photos(candidate, given or MAX_FOLDER_PHOTOS)
        return Photos(f"the {len(carried)} held-out photos {candidate.archive.name} carries (its export's "
                      "--holdout-photos)", carried)
    count = given or PHOTO_COUNT
    return Photos(f"the built-in set ({count} scikit-image photographs; --photos DIR or the export's "
                  "--holdout-photos DIR give the model's own domain)", held_out_photos(count))


def run_gate(task: str, live: str, candidate: str, ask_live: Callable[[bytes], dict],
             ask_candidate: Callable[[bytes], dict], photos: Photos) -> GateResult:
    """Both versions' answers to each photo (ask_*: one real HTTP request each, GATE_PHOTOS_AT_ONCE photos asked
    of both at once), compared by the task's rule in the photos' order; the first request that fails ends it."""
    compare, sides = comparator(task), Sides(live, candidate)
    result = GateResult(task, live, candidate, photos.source)
    pool = ThreadPoolExecutor(2 * GATE_PHOTOS_AT_ONCE, thread_name_prefix="gate")
    try:
        asked = [(name, pool.submit(ask_live, image), pool.submit(ask_candidate, image)) for name, image in photos.items]
        for name, live_answer, candidate_answer in asked:
            result.verdicts.append(PhotoVerdict(name, compare(live_answer.result(), candidate_answer.result(),
                                                              sides=sides)))
    finally:  # a failure: the requests not yet sent are not sent
        pool.shutdown(wait=True, cancel_futures=True)
    return result
