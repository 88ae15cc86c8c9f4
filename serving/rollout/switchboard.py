"""What a rollout asks of an engine, one small interface: which version serves a name, load another beside it
(ready once it answered a real prediction), ask one version directly, make one the default, unload one once it
drained. Each engine that serves from a run dir provides it (serving/ENGINE/switchboard.py);
the rollout itself (serving/rollout/command.py) is the same for all."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from pathlib import Path

from contract.records import Manifest
from contract.versions import UNVERSIONED, archive_name, parse_label
from serving.rollout.candidate import Candidate, RolloutRefused, served_manifest
from serving.settings import ServingError

DRAIN_GRACE_S = 3.0  # after the switch, requests the old version already took finish before it unloads
LOAD_TIMEOUT_S = 240  # a version loaded beside the live one answers a real prediction within this


class Switchboard(ABC):
    """One running server's versions, reached through its run dir."""

    engine: str  # the engine's name, as --engine says it

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)

    def run_config(self, file_name: str, label: str, start: str) -> Path:
        """RUN_DIR/file_name, the run config the engine's start wrote, or the error saying how to start one."""
        path = self.run_dir.absolute() / file_name
        if not path.is_file():
            raise ServingError(f"no {label} run config in {self.run_dir} ({file_name}): start the server with "
                               f"`{start}` from the same --run-dir")
        return path

    @property
    @abstractmethod
    def model_store(self) -> Path:
        """The folder the server loads its archives from."""

    @abstractmethod
    def live(self, name: str) -> str:
        """The label of the version name's requests go to."""

    @abstractmethod
    def loaded(self, name: str) -> list[str]:
        """Every version of name the server holds now."""

    @abstractmethod
    def load_beside(self, name: str, candidate: Candidate) -> None:
        """The candidate loaded beside the live version, not yet taking its traffic; returns once it answered a
        real prediction, RolloutRefused (with the engine's reason) when it cannot load, leaving nothing loaded."""

    @abstractmethod
    def ask(self, name: str, label: str, image: bytes, headers: dict) -> dict:
        """One real HTTP request to that version of name: its JSON answer."""

    @abstractmethod
    def set_default(self, name: str, label: str) -> None:
        """From now on name's requests go to that version (one already in flight finishes where it is)."""

    @abstractmethod
    def unload(self, name: str, label: str) -> None:
        """That version out of the server (it stays in the store)."""

    @abstractmethod
    def canary(self, name: str, label: str, percent: float) -> dict:
        """percent % of name's live requests answered by that loaded version from now on, 0 ending it; what the
        canary answered so far: {"label", "percent", "served", "failed"}."""

    @abstractmethod
    def capture(self, name: str, count: int) -> None:
        """From now on the photos of name's next count live requests are kept as they arrive, their answers
        untouched; 0 stops and forgets what was kept."""

    @abstractmethod
    def captured(self, name: str) -> list[tuple[str, bytes]]:
        """(the request's id, its photo's bytes) of each live request kept since the capture began, in arrival
        order."""

    def drain_and_unload(self, name: str, label: str) -> None:
        time.sleep(DRAIN_GRACE_S)
        self.unload(name, label)

    def live_manifest(self, name: str) -> Manifest:
        """The live version's manifest, from its archive in the store (its task: which gate judges the candidate).
        Read, not checked: the server checked what it serves when it opened it."""
        label = self.live(name)
        archive = self.model_store / (f"{name}.mar" if label == UNVERSIONED else archive_name(name, parse_label(label)))
        if not archive.is_file():
            raise ServingError(f"{name} serves {label}, whose archive {archive} is no longer in the store")
        return served_manifest(archive)

    def refuse_unless_loaded(self, name: str) -> None:
        if not self.loaded(name):
            raise RolloutRefused(f"the {self.engine} server of {self.run_dir} does not serve {name}")


def answer_of(response, what: str) -> dict:
    """A 200's JSON, or RolloutRefused with what the server answered."""
    if response.status_code != 200:
        raise RolloutRefused(f"{what} answered HTTP {response.status_code}: {response.text[:300]}")
    return response.json()
