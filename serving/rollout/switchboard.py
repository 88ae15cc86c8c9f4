"""What a rollout asks of an engine, one small interface: which version serves a name, load another beside it
(ready once it answered a real prediction), ask one version directly, make one the default, unload one once it
drained. Each engine that serves from a run dir provides it (serving/ENGINE/switchboard.py);
the rollout itself (serving/rollout/command.py) is the same for all. A server that carries the version routes
itself (KServe's app, Ray's server process) is driven through them (RoutedSwitchboard), each step one HTTP call."""

from __future__ import annotations

import base64
import time
from abc import ABC, abstractmethod
from pathlib import Path

import requests

from contract.records import Manifest
from contract.versions import UNVERSIONED, archive_name, parse_label
from serving.auth import MANAGEMENT, VERSION_ROUTES, auth_headers
from serving.rollout.candidate import Candidate, RolloutRefused, served_manifest
from serving.settings import EXAMPLE_IMAGE, ServingError, ServingSettings

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


class RoutedSwitchboard(Switchboard):
    """A server whose own process carries the version routes (VERSION_ROUTES; the management key, or loopback
    without tokens): the process that holds the versions does each step, so a rollout needs no client of the
    engine's own, only HTTP. The engine's part: where the routes answer, and how one version is asked.

      GET    /rollout/NAME              {"default": "v1", "loaded": ["v1", "v2"], "canary": its report or null}
      POST   /rollout/NAME/vN           load NAME.vN.mar beside (answers once it answered a real prediction)
      PUT    /rollout/NAME/vN/default   NAME's requests go to vN from now on
      PUT    /rollout/NAME/vN/canary?percent=P   P % of NAME's requests go to vN (0 ends it)
      PUT    /rollout/NAME/capture?count=N       keep the photos of NAME's next N requests (0 stops and forgets them)
      GET    /rollout/NAME/captured              {"captured": [{"id": request id, "b64": photo}, ...]}
      DELETE /rollout/NAME/vN           unload vN (not the default) once it drained
    An error answers {"detail": why}."""

    settings: ServingSettings

    @property
    @abstractmethod
    def control_url(self) -> str:
        """http://HOST:PORT where the server's version routes answer, on this machine."""

    def versions(self, method: str, path: str) -> requests.Response:
        return requests.request(method, f"{self.control_url}{VERSION_ROUTES}/{path}", timeout=LOAD_TIMEOUT_S,
                                headers=auth_headers(self.settings, MANAGEMENT))

    def live(self, name: str) -> str:
        return answer_of(self.versions("GET", name), f"{name}'s versions")["default"]

    def loaded(self, name: str) -> list[str]:
        response = self.versions("GET", name)
        return answer_of(response, f"{name}'s versions")["loaded"] if response.status_code == 200 else []

    def load_beside(self, name: str, candidate: Candidate) -> None:
        """Loaded once the server says it runs (KServe: its first worker; Ray: its replica), then ready once it
        answered a real prediction; one that cannot is unloaded and refused."""
        response = self.versions("POST", f"{name}/{candidate.label}")
        if response.status_code != 200:
            raise RolloutRefused(f"{candidate.label} cannot load beside {self.live(name)}: {detail_of(response)}")
        try:
            self.ask(name, candidate.label, EXAMPLE_IMAGE.read_bytes(), {"Content-Type": "image/jpeg"})
        except (RolloutRefused, requests.RequestException) as error:
            self.unload(name, candidate.label)
            raise RolloutRefused(f"{candidate.label} loaded but did not answer a prediction: {error}") from None

    def set_default(self, name: str, label: str) -> None:
        answer_of(self.versions("PUT", f"{name}/{label}/default"), f"switching {name} to {label}")

    def canary(self, name: str, label: str, percent: float) -> dict:
        return answer_of(self.versions("PUT", f"{name}/{label}/canary?percent={percent}"), f"a canary of {name} {label}")

    def capture(self, name: str, count: int) -> None:
        answer_of(self.versions("PUT", f"{name}/capture?count={count}"), f"keeping {name}'s requests")

    def captured(self, name: str) -> list[tuple[str, bytes]]:
        kept = answer_of(self.versions("GET", f"{name}/captured"), f"{name}'s kept requests")["captured"]
        return [(photo["id"], base64.b64decode(photo["b64"])) for photo in kept]

    def drain_and_unload(self, name: str, label: str) -> None:
        self.unload(name, label)  # the server waits until the requests the old version holds are answered

    def unload(self, name: str, label: str) -> None:
        answer_of(self.versions("DELETE", f"{name}/{label}"), f"unloading {name} {label}")


def detail_of(response) -> str:
    """What a server's error answer says (FastAPI's {"detail": ...}, as ours), else the start of its text."""
    try:
        return str(response.json().get("detail") or response.text[:300])
    except (ValueError, AttributeError):
        return response.text[:300]


def answer_of(response, what: str) -> dict:
    """A 200's JSON, or RolloutRefused with what the server answered."""
    if response.status_code != 200:
        raise RolloutRefused(f"{what} answered HTTP {response.status_code}: {response.text[:300]}")
    return response.json()
