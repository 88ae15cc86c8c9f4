"""What a comparison of two answers returns, in the names of the two sides it compared."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class Sides(NamedTuple):
    """The two sides a comparison names: the reference (eager, the live version) and the candidate."""

    reference: str = "the reference"
    candidate: str = "the candidate"


EAGER_AND_FORM = Sides("eager", "the form")  # export's parity: a form held to eager PyTorch
LIVE_AND_CANDIDATE = Sides("the live version", "the candidate")  # a rollout asked without the versions' labels


@dataclass(frozen=True)
class Verdict:
    """One photo's comparison: whether the two answers agree, how (in the sides' names), and whether the photo
    carried evidence (something to agree on: a confident class, a box, a foreground pixel)."""

    agrees: bool
    how: str
    evidence: bool
