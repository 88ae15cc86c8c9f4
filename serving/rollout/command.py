"""`python -m serving rollout NAME PATH`, `rollback NAME`, `versions NAME`: a new version of a served model loaded
beside the live one, proven to agree with it on the export's held-out photos, then given the traffic; the old one
drains and unloads, and stays in the store. Any refusal leaves the live version serving, untouched, and exits
non-zero with the reason.

  python -m serving rollout resnet18 model-store/resnet18.v2.mar   # or an export folder (archived as the next version)
  python -m serving rollback resnet18                               # back to the previous kept version
  python -m serving versions resnet18                               # loaded, default, kept
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from contract.errors import EXIT_INTERRUPTED, INTERRUPTIONS, Stopped
from contract.versions import (
    REFUSED_FOLDER,
    archive_name,
    make_live,
    parse_label,
    record_default,
    stored_versions,
)
from serving.rollout.candidate import (
    Candidate,
    RolloutRefused,
    check_task,
    checked_manifest,
    leave_store,
    prepare,
)
from serving.rollout.gate import (
    PHOTO_COUNT,
    REQUEST_HEADERS,
    GateResult,
    Photos,
    comparator,
    photos_for,
    run_gate,
)
from serving.rollout.switchboard import Switchboard
from serving.settings import DEFAULT_RUN_DIR, ServingError

PROG = "python -m serving"
CANARY_S = 30.0  # the canary's share of live requests before it is checked again
SHADOW_S = 120.0  # the live requests --shadow mirrors arrive within this, or the rollout is refused
SHADOW_POLL_S = 0.5
COMMANDS = ("rollout", "rollback", "versions")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)  # a supervisor's stop and Ctrl-C: both end the rollout as a refusal


class RolloutInterrupted(ServingError):
    """A signal ended the rollout before the switch; it was undone as a refusal is."""

    exit_code = EXIT_INTERRUPTED


def parser_for(command: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"{PROG} {command}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", help="the served model's name (its /predictions/NAME)")
    if command == "rollout":
        parser.add_argument("path", type=Path, help="the new version: an archive (.mar) or an export folder")
        parser.add_argument("--force", action="store_true",
                            help="switch even when the versions disagree beyond the thresholds (the table still shows it)")
        parser.add_argument("--photos", type=photo_source, default=None, metavar="N|DIR",
                            help="the photos both versions answer: a folder DIR of photos of the model's own domain; "
                                 "default: the held-out photos the candidate's archive carries (python -m export "
                                 f"--holdout-photos DIR), else {PHOTO_COUNT} built-in photographs; N: the first N "
                                 "of those")
        parser.add_argument("--accept-weak-evidence", action="store_true",
                            help="switch even when too few photos carried evidence to judge (e.g. random weights); "
                                 "said in the rollout's outcome")
        parser.add_argument("--canary", type=float, default=None, metavar="P",
                            help="first P %% of the live requests to the new version, checked again, then all")
        parser.add_argument("--canary-seconds", type=float, default=CANARY_S, metavar="S",
                            help=f"how long the canary takes its share before the check (default {CANARY_S:.0f})")
        parser.add_argument("--shadow", type=int, default=None, metavar="N",
                            help="the next N live requests' photos mirrored to both versions (their answers "
                                 "untouched) and held to the same agreement as the held-out photos")
        parser.add_argument("--shadow-seconds", type=float, default=SHADOW_S, metavar="S",
                            help=f"how long to wait for the N live requests (default {SHADOW_S:.0f})")
    if command == "rollback":
        parser.add_argument("--to", default=None, metavar="vN", help="the version to return to (default: the "
                                                                      "newest kept version older than the live one)")
    parser.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR,
                        help=f"the run dir of the running server, as for stop (default: {DEFAULT_RUN_DIR})")
    return parser


def photo_source(text: str) -> int | Path:
    return int(text) if text.isdigit() else Path(text)


def main(command: str, argv: list[str]) -> int:
    args = parser_for(command).parse_args(argv)
    board = switchboard_for(args.run_dir)
    board.refuse_unless_loaded(args.name)
    return {"rollout": rollout, "rollback": rollback, "versions": versions}[command](board, args)


def switchboard_for(run_dir: Path) -> Switchboard:
    """The switchboard of the engine whose server runs from run_dir."""
    from serving import engine as engines
    running = [engine for engine in engines.engines_running_in(run_dir) if engine.is_running()]
    if not running:
        raise ServingError(f"no server running from {Path(run_dir).absolute()}: start one with `{PROG} --detach` "
                           "(--run-dir as here)")
    return running[0].switchboard()


def rollout(board: Switchboard, args: argparse.Namespace) -> int:
    check_flags(args)
    # A folder that cannot serve is said before anything is stored or loaded; other photos come with the candidate.
    given = photos_for(args.photos) if isinstance(args.photos, Path) else None
    name, live = args.name, board.live(args.name)
    task = board.live_manifest(name).task
    with stops_once():
        try:
            candidate = prepare(args.path, name, board.model_store)
        except INTERRUPTIONS:  # an archive half built is discarded where it was built
            raise RolloutInterrupted(f"the rollout was interrupted while {args.path} was checked: nothing was "
                                     f"loaded; {live} serves on") from None
        if candidate.label == live:
            raise RolloutRefused(f"{name} already serves {live} ({candidate.archive}): nothing to roll out")
        try:  # whatever ends the rollout before the switch (a refusal, an error, a signal) undoes it
            check_task(candidate, task, name)
            caveats = prove(board, args, candidate, live, task,
                            lambda: given or photos_for(args.photos, candidate))
        except BaseException as error:
            raise undone(board, name, live, candidate, error, isinstance(error, RolloutRefused)) from None
        switch(board, name, live, candidate)
    for caveat in caveats:
        say(f"{name}: {candidate.label} took the traffic {caveat}")
    return 0


def prove(board: Switchboard, args: argparse.Namespace, candidate: Candidate, live: str, task: str,
          read_photos: Callable[[], Photos]) -> list[str]:
    """The candidate loaded beside the live version and held to the gate (its photos read meanwhile: the load is
    a wait on the server), then to --shadow and --canary; what the operator overrode to get there (the rollout's
    outcome says it)."""
    name = args.name
    say(f"rollout of {name} on {board.engine}: live {live}, candidate {candidate.label} "
        f"({candidate.archive}, content {candidate.manifest.model_version.content[:12]})")  # type: ignore[union-attr]
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="gate-photos") as reader:
        reading = reader.submit(gate_prepared, task, read_photos)
        board.load_beside(name, candidate)
        say(f"{candidate.label} loaded beside {live} and answering ({time.monotonic() - started:.1f} s)")
        photos = reading.result()
    headers = REQUEST_HEADERS[task]

    def gate_on(photos: Photos):
        return run_gate(task, live, candidate.label, lambda image: board.ask(name, live, image, headers),
                        lambda image: board.ask(name, candidate.label, image, headers), photos)

    caveats = judge(args, candidate, live, gate_on(photos), "on its photos", evidence_later=args.shadow is not None)
    if args.shadow is not None:
        caveats += shadow(board, args, candidate, gate_on)
    if args.canary is not None:
        canary(board, args, candidate, lambda: gate_on(photos))
    return caveats


def gate_prepared(task: str, read_photos: Callable[[], Photos]) -> Photos:
    """The gate's photos, and its task's comparator imported (torch, for some): what the gate needs before it
    asks both versions, done while the candidate loads."""
    comparator(task)
    return read_photos()


def undone(board: Switchboard, name: str, live: str, candidate: Candidate, error: BaseException,
           refused: bool) -> BaseException:
    """The candidate out of the server and the store as it was (a refused one set apart), after whatever ended the
    rollout before its switch; the error to raise, saying so. Any canary or capture already ended with its step."""
    steps = []
    try:
        if candidate.label in board.loaded(name):
            board.unload(name, candidate.label)
            steps.append(f"{candidate.label} unloaded")
        steps.append(leave_store(candidate, name, live_number(live), refused))
    except Exception as failed:  # the original error stays the one raised; this one is said with it
        steps.append(f"undoing it failed ({failed}): check `{PROG} versions {name}`")
    if isinstance(error, INTERRUPTIONS):
        return RolloutInterrupted(f"the rollout of {candidate.label} was interrupted before the switch: "
                                  f"{'; '.join(steps)}; {live} serves on")
    if isinstance(error, Exception):
        error.add_note("; ".join(steps))
    return error


def live_number(label: str) -> int:
    return parse_label(label) if label.lstrip("v").isdigit() else 0


@contextlib.contextmanager
def stops_once():
    """SIGTERM and Ctrl-C stop the rollout once (Stopped, undone as a refusal is); a second signal while it is
    undone is ignored, so that the undoing finishes. The handlers before are back afterwards."""
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return
    before = {number: signal.getsignal(number) for number in STOP_SIGNALS}

    def stop(signum, frame):
        for number in STOP_SIGNALS:
            signal.signal(number, signal.SIG_IGN)
        raise Stopped

    for number in STOP_SIGNALS:
        signal.signal(number, stop)
    try:
        yield
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


@contextlib.contextmanager
def ignoring_stops():
    """SIGTERM and Ctrl-C ignored for a while (the handlers before are back afterwards)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {number: signal.signal(number, signal.SIG_IGN) for number in STOP_SIGNALS}
    try:
        yield
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


def shadow(board: Switchboard, args: argparse.Namespace, candidate: Candidate, gate_on) -> list[str]:
    """The photos of the next N live requests, kept as they arrive (their answers untouched), then sent to both
    versions and held to the gate's agreement. Too few requests within --shadow-seconds, or a disagreement, and the
    candidate unloads while the live version serves on."""
    name, live, count = args.name, board.live(args.name), args.shadow
    board.capture(name, count)
    say(f"shadow: the next {count} requests to {name} mirrored to {candidate.label} (waiting up to "
        f"{args.shadow_seconds:g} s)")
    deadline = time.monotonic() + args.shadow_seconds
    try:
        while len(kept := board.captured(name)) < count and time.monotonic() < deadline:
            time.sleep(SHADOW_POLL_S)
    finally:
        board.capture(name, 0)
    if len(kept) < count:
        raise RolloutRefused(f"only {len(kept)} of the {count} live requests --shadow waits for reached {name} within "
                             f"{args.shadow_seconds:g} s; {live} serves on, {candidate.label} unloaded (lower --shadow "
                             "or raise --shadow-seconds)")
    gate = gate_on(Photos(f"the next {count} live requests (--shadow)",
                          [(f"request {request_id}", photo) for request_id, photo in kept[:count]]))
    return judge(args, candidate, live, gate, "on live requests")


def judge(args: argparse.Namespace, candidate: Candidate, live: str, gate: GateResult, on: str,
          evidence_later: bool = False) -> list[str]:
    """The gate's table; a gate that fails refuses the candidate, the live version serving on: a disagreement
    unless --force, too little evidence unless --shadow is still to bring it or --accept-weak-evidence. Returns
    what was overridden, in words."""
    say(gate.table())
    if not gate.agrees:
        if not args.force:
            raise RolloutRefused(f"{candidate.label} disagrees with {live} {on} beyond the thresholds "
                                 f"({gate.disagreements()}); {live} serves on, {candidate.label} unloaded (--force "
                                 "switches anyway)")
        say(f"--force: going on although {candidate.label} disagrees with {live} {on}")
        return [f"although it disagreed with {live} {on} (--force)"]
    if gate.enough_evidence:
        return []
    if evidence_later:
        say(f"{on}, {gate.too_little_evidence()}: the live requests --shadow mirrors must carry it")
        return []
    if args.accept_weak_evidence:
        say(f"--accept-weak-evidence: going on although, {on}, {gate.too_little_evidence()}")
        return [f"on weak evidence (--accept-weak-evidence): {on}, {gate.too_little_evidence()}"]
    raise RolloutRefused(f"{candidate.label} cannot be judged against {live} {on}: {gate.too_little_evidence()}; "
                         f"{live} serves on, {candidate.label} unloaded. Give photos of the model's own domain "
                         "(--photos DIR, or carried by its export: python -m export ... --holdout-photos DIR), judge "
                         "it on live traffic (--shadow N), or, if you know its answers need "
                         "no proof, --accept-weak-evidence")


def canary(board: Switchboard, args: argparse.Namespace, candidate: Candidate, gate_again) -> None:
    """A share of the live requests to the candidate for a while; then checked again: none of the requests it
    answered may have failed, and the gate (asked once the share ended, so that each version answers its own)
    must pass again. Otherwise the candidate unloads, and the live version serves on."""
    name, live = args.name, board.live(args.name)
    board.canary(name, candidate.label, args.canary)
    say(f"canary: {args.canary:g} % of {name}'s requests to {candidate.label} for {args.canary_seconds:g} s")
    try:
        time.sleep(args.canary_seconds)
    finally:  # interrupted too: the share ends with the command
        report = board.canary(name, candidate.label, 0)
    served, failed = report.get("served", 0), report.get("failed", 0)
    if not served + failed + report.get("declined", 0):
        raise RolloutRefused(f"the canary {candidate.label} failed its check: it answered none of {name}'s requests "
                             f"in {args.canary_seconds:g} s, so nothing proves it on live traffic ({live} answered "
                             "them all); raise --canary-seconds or --canary while requests arrive")
    gate = gate_again()
    say(gate.table())
    if failed or not (gate.agrees or args.force):
        why = f"{failed} of the {served + failed} requests it was given failed" if failed else gate.disagreements()
        raise RolloutRefused(f"the canary {candidate.label} failed its check ({why}); {live} serves on, "
                             f"{candidate.label} unloaded")
    say(f"canary: {candidate.label} answered {served} of {name}'s requests, none failed; the versions agree again")


def check_flags(args: argparse.Namespace) -> None:
    if args.canary is not None and not 0 < args.canary < 100:
        raise ServingError(f"--canary {args.canary:g}: give a percentage above 0 and below 100 (e.g. --canary 10)")
    if isinstance(args.photos, int) and args.photos < 1:
        raise ServingError(f"--photos {args.photos}: give at least 1 photo, or a folder of photos (--photos DIR)")
    if args.shadow is not None and args.shadow < 1:
        raise ServingError(f"--shadow {args.shadow}: give the number of live requests to mirror (e.g. --shadow 20)")


def switch(board: Switchboard, name: str, old: str, new: Candidate) -> None:
    """The new version takes the traffic, recorded in the run dir and made the store's NAME.mar (a restart, and a
    start from the store alone, serve it), then the old one drains and unloads; it stays in the store for a
    rollback. A signal meanwhile waits: a switch half made would leave the server and the store apart."""
    with ignoring_stops():
        started = time.monotonic()
        board.set_default(name, new.label)
        record_default(board.run_dir.absolute(), name, new.label)
        make_live(board.model_store, name, new.number)  # a start from the store alone serves it too
        say(f"{name}: {new.label} is the default ({time.monotonic() - started:.2f} s, {name}.mar in the store); "
            f"{old} draining")
        board.drain_and_unload(name, old)
    say(f"{name}: {old} unloaded (kept in {board.model_store}); serving {new.label}")


def rollback(board: Switchboard, args: argparse.Namespace) -> int:
    name, live = args.name, board.live(args.name)
    target = parse_label(args.to) if args.to else previous_version(board.model_store, name, live)
    archive = board.model_store / archive_name(name, target)
    if not archive.is_file():
        raise RolloutRefused(f"{archive} is no longer in the store: nothing to roll back to")
    candidate = Candidate(archive, checked_manifest(archive))
    say(f"rollback of {name} on {board.engine}: live {live}, back to {candidate.label}")
    with stops_once():
        try:
            board.load_beside(name, candidate)
        except BaseException as error:
            raise undone(board, name, live, candidate, error, refused=False) from None
        switch(board, name, live, candidate)
    return 0


def previous_version(model_store: Path, name: str, live: str) -> int:
    current = live_number(live)
    older = [number for number in stored_versions(model_store, name) if number < current]
    if not older:
        raise RolloutRefused(f"the store keeps no version of {name} older than {live}: nothing to roll back to")
    return older[-1]


def versions(board: Switchboard, args: argparse.Namespace) -> int:
    name = args.name
    kept = ", ".join(f"v{number}" for number in stored_versions(board.model_store, name)) or "none"
    refused = ", ".join(f"v{number}" for number in stored_versions(board.model_store / REFUSED_FOLDER, name))
    say(f"{name} on {board.engine}: default {board.live(name)}; loaded {', '.join(board.loaded(name))}; "
        f"kept in {board.model_store}: {kept}" + (f"; refused, set apart: {refused}" if refused else ""))
    return 0


def say(line: str) -> None:
    print(line, flush=True)
