"""Kill a worker under load and measure what it costs, on each engine: `python -m measure faults`.

  python -m measure faults [--engine torchserve|kserve|ray] [--model-store model-store] [--model NAME]
                           [--clients 4] [--before-kill 3] [--out fault-results]

Starts the engine on free loopback ports with the archive (--model, default the store's only archive) and
WORKERS workers, waits until every worker has opened the model (measure/reliability/workers.py says how each
engine lists them), keeps CLIENTS threads sending predictions back to back, after --before-kill seconds
SIGKILLs one worker (TorchServe's worker process, one of KServe's pool, a Ray Serve replica), and measures how
many requests failed, how many answers were wrong (a 200 whose answer is not the one its form gave before the kill), how long until the
replacement (a new pid in the killed one's place) gave its first answer, where its start's seconds went (its
start phases, handlers/start_phases.py), and whether every request after that succeeded. Prints the figures
with the machine's load average, writes faults.json and faults.md to --out, and exits non-zero when more
requests failed than were in flight, an answer was wrong, a request after recovery failed, or the replacement
answered later than the engine's target (RECOVERY_TARGET_S). tests/e2e/test_faults.py runs the same
measurement and holds it to the behaviour, not to the seconds.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import requests

from contract.errors import VisionExportError
from contract.files import atomic_write_text
from contract.policy import PolicyChoices
from handlers.start_phases import PHASES, read_phases
from measure.command import archive_name, load_command_parser, run_load_command
from measure.reliability.workers import serving_pids, wait_all_serving
from serving import engine as engines
from serving.settings import REQUEST_TIMEOUT_S

# A replacement answering within this many seconds of the kill: the targets each engine is reported against.
RECOVERY_TARGET_S = {"torchserve": 5, "kserve": 5, "ray": 10}
ENGINES = tuple(RECOVERY_TARGET_S)
WORKERS = 2  # one killed, the other answers meanwhile (KServe runs a pool of workers only from two on)
LOAD_BEFORE_KILL_S = 3  # steady load before the kill (--before-kill: a server that has served a while)
LOAD_AFTER_RECOVERY_S = 3  # and after recovery: every one of these requests must succeed
GIVE_UP_S = 60  # a replacement that has not answered by then is reported as not recovered
POLL_S = 0.2
ATOL = 1e-4  # a probability further than this from its form's answer before the kill makes an answer wrong
OK, WRONG = "HTTP 200", "HTTP 200, wrong answer"


class FaultError(VisionExportError):
    """The server did not recover from the fault as required; the message carries the numbers."""


@dataclass
class KillResult:
    clients: int
    requests: int  # answered or failed, over the whole run
    failed: int  # non-200 answers and requests that got no answer (wrong answers not among them)
    recovery_s: float  # from the kill until the replacement gave its first answer (GIVE_UP_S: never)
    respawn_s: float | None  # from the kill until the replacement process started (None: no replacement seen)
    recovered: bool
    requests_after_recovery: int
    failed_after_recovery: int
    killed_pid: int
    pids_before: list
    pids_after: list
    outcomes: dict = field(default_factory=dict)  # "HTTP 200", "HTTP 503", "ConnectionError", ... -> count
    engine: str = "torchserve"
    wrong: int = 0  # 200s whose answer differs from the one its form gave before the kill
    phases: dict = field(default_factory=dict)  # the replacement's start phases, seconds each (where recorded)
    load_average: list = field(default_factory=list)  # the machine's 1, 5 and 15 min load at the kill


def problems(result: KillResult) -> list[str]:
    """What the engine did wrong: the behaviour every engine must show, whatever the machine's speed."""
    found = []
    if not result.recovered:
        found.append(f"worker {result.killed_pid} was not replaced by one that answered within {GIVE_UP_S} s")
    if result.failed > result.clients:
        found.append(f"{result.failed} requests failed, more than the {result.clients} that could be in flight")
    if result.wrong:
        found.append(f"{result.wrong} requests were answered wrongly")
    if result.recovered and not result.requests_after_recovery:
        found.append("no request was answered after recovery")
    elif result.failed_after_recovery:
        found.append(f"{result.failed_after_recovery} of {result.requests_after_recovery} requests after "
                     f"recovery failed")
    return found


def missed_target(result: KillResult) -> list[str]:
    """The recovery's seconds against the engine's target (a figure of this machine, not a behaviour)."""
    target = RECOVERY_TARGET_S[result.engine]
    if result.recovered and result.recovery_s > target:
        return [f"the replacement answered {result.recovery_s:.1f} s after the kill (target {target} s)"]
    return []


def summary(result: KillResult) -> str:
    target = RECOVERY_TARGET_S[result.engine]
    if not result.recovered:
        recovery = f"no replacement worker answered within {GIVE_UP_S} s"
    else:
        started = started_text(result.respawn_s)
        recovery = (f"the replacement answered {result.recovery_s:.1f} s after the kill (target {target} s): "
                    f"{started}{phases_text(result.phases) or 'no start phases recorded'}")
    load = f"; load average {'/'.join(f'{value:.2f}' for value in result.load_average)}" if result.load_average else ""
    return (f"{result.engine} worker kill: {result.failed} of {result.requests} requests failed, {result.wrong} "
            f"answered wrongly ({result.clients} clients); {recovery}; {result.failed_after_recovery} of "
            f"{result.requests_after_recovery} later requests failed{load}"
            + (f" (outcomes: {', '.join(f'{k} x{n}' for k, n in sorted(result.outcomes.items()))})"
               if result.outcomes else ""))


def started_text(respawn_s: float | None) -> str:
    if respawn_s is None:
        return ""
    if respawn_s < 0:  # a spare (KServe's pool) whose imports were done before the kill
        return (f"a spare process started {-respawn_s:.1f} s before the kill took its place (its process and "
                "imports phase is its age); ")
    return f"its process started {respawn_s:.1f} s after the kill; "


def phases_text(phases: dict) -> str:
    return ", ".join(f"{phase.replace('_', ' ')} {phases[phase]:.2f} s" for phase in PHASES if phase in phases)


def process_start_s(pid: int) -> float:
    """When a process started, in CLOCK_BOOTTIME seconds (field 22 of /proc/PID/stat, in clock ticks)."""
    after_name = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # fields 3 onwards
    return int(after_name[19]) / os.sysconf("SC_CLK_TCK")


def same_answer(answer: dict, reference: dict) -> bool:
    """The same classes in the same order, each probability within ATOL."""
    ours, theirs = answer.get("predictions", []), reference.get("predictions", [])
    return len(ours) == len(theirs) and all(
        a.get("index") == b.get("index") and abs(a.get("probability", 0) - b.get("probability", 0)) <= ATOL
        for a, b in zip(ours, theirs))


class Client:
    """One image posted as a client of the engine does; each 200 held to the first answer its form gave."""

    def __init__(self, engine, model: str, image: bytes):
        self.engine, self.url = engine, next(iter(engine.urls(model).values()))
        self.body, content_type = engine.client_body(image)
        self.headers = {"Content-Type": content_type, **engine.request_headers()}
        self.references: dict[str, dict] = {}  # form -> its first answer (the forms of the workers may differ)

    def predict(self) -> str:
        """One request's outcome: OK, WRONG, "HTTP <status>", or the kind of error that left it unanswered."""
        try:
            response = requests.post(self.url, data=self.body, timeout=REQUEST_TIMEOUT_S, headers=self.headers)
        except requests.RequestException as error:  # the kill's expected cost: counted by kind, never raised
            return type(error).__name__
        if response.status_code != 200:
            return f"HTTP {response.status_code}"
        answer = self.engine.answer_of(response)
        reference = self.references.setdefault(answer.get("artifact", ""), answer)
        return OK if same_answer(answer, reference) else WRONG


def replacement_phases(run_dir: Path, pid: int) -> dict | None:
    """The start phases the process pid wrote, None before it wrote any."""
    return next((phases for phases in read_phases(run_dir) if phases["pid"] == pid), None)


def kill_worker_under_load(engine, process, model: str, image: Path, clients: int,
                           before_kill_s: float = LOAD_BEFORE_KILL_S) -> KillResult:
    """On engine's running server (process: its server process): before_kill_s of load, SIGKILL one of model's
    workers, wait until its replacement has answered, load on; the figures."""
    before = wait_all_serving(engine, model, process.pid, FaultError)
    client = Client(engine, model, image.read_bytes())
    client.predict()  # each form's reference answer, before any kill
    outcomes: list[tuple[float, str]] = []  # (time the answer came, outcome); list.append is thread-safe
    stop = threading.Event()

    def keep_sending():
        while not stop.is_set():
            outcome = client.predict()
            outcomes.append((time.monotonic(), outcome))

    with ThreadPoolExecutor(clients) as pool:
        for _ in range(clients):
            pool.submit(keep_sending)
        time.sleep(before_kill_s)
        killed_at, killed_unix, killed_boot_s = time.monotonic(), time.time(), time.clock_gettime(time.CLOCK_BOOTTIME)
        os.kill(before[0], signal.SIGKILL)
        load_average = [round(value, 2) for value in os.getloadavg()]
        back_at, replacement, phases = killed_at + GIVE_UP_S, None, None
        while time.monotonic() < killed_at + GIVE_UP_S:
            replacement, phases = answered_replacement(engine, model, process.pid, before)
            if phases is not None:
                back_at = time.monotonic()
                break
            time.sleep(POLL_S)
        time.sleep(LOAD_AFTER_RECOVERY_S)
        stop.set()
    after = serving_pids(engine, model, process.pid)
    later = [outcome for t, outcome in outcomes if t > back_at]
    recovered = phases is not None
    respawn_s = round(process_start_s(replacement) - killed_boot_s, 2) if recovered and replacement in after else None
    return KillResult(clients, len(outcomes), sum(outcome not in (OK, WRONG) for _, outcome in outcomes),
                      round(phases["ready_at"] - killed_unix, 2) if recovered else float(GIVE_UP_S), respawn_s,
                      recovered, len(later), sum(outcome != OK for outcome in later), before[0], before, after,
                      dict(Counter(outcome for _, outcome in outcomes)), engine.name,
                      sum(outcome == WRONG for _, outcome in outcomes),
                      {phase: round(s, 2) for phase, s in phases["seconds"].items()} if recovered else {},
                      load_average)


def answered_replacement(engine, model: str, server_pid: int, before: list[int]) -> tuple[int | None, dict | None]:
    """(the replacement's pid, its start phases) once every worker is back, the killed one among them no more, and
    the replacement has given its first answer (its phases say when); (pid or None, None) before."""
    try:
        pids = serving_pids(engine, model, server_pid)
    except (requests.RequestException, ValueError, KeyError, IndexError):  # the listing itself was refused: not yet
        return None, None
    new = [pid for pid in pids if pid not in before]
    if before[0] in pids or len(pids) < len(before) or not new:
        return None, None
    phases = replacement_phases(engine.settings.run_dir, new[0])
    return new[0], phases if phases and phases.get("ready_at") else None


def fault_settings(engine_name: str, model_store: Path, model: str, out: Path, token_auth: bool = False):
    """The engine's settings serving model on free loopback ports with WORKERS workers, its run dir in out."""
    settings = engines.get(engine_name).on_free_ports(model_store, out / "run", (model,))
    settings.flags = PolicyChoices(workers=WORKERS)
    settings.token_auth = token_auth
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    return settings


def main(argv: list[str] | None = None) -> int:
    return run_load_command(lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    parser = load_command_parser("faults", __doc__, out="fault-results")
    parser.add_argument("--engine", choices=ENGINES, default="torchserve")
    parser.add_argument("--clients", type=int, default=4, help="threads sending back to back (default 4)")
    parser.add_argument("--before-kill", type=float, default=LOAD_BEFORE_KILL_S,
                        help=f"seconds of load before the kill, once every worker has opened the model (default "
                             f"{LOAD_BEFORE_KILL_S}; longer: a server whose spare, where it has one, is ready)")
    args = parser.parse_args(argv)
    if args.clients < 1 or args.before_kill < 0:
        raise FaultError("--clients must be at least 1, --before-kill 0 or more")
    model = archive_name(args.model_store, args.model)
    args.out.mkdir(parents=True, exist_ok=True)
    engine = engines.get(args.engine)(fault_settings(args.engine, args.model_store, model, args.out, args.token_auth))
    with engine.running(args.image) as process:
        result = kill_worker_under_load(engine, process, model, args.image, args.clients, args.before_kill)
    found, missed = problems(result), missed_target(result)
    atomic_write_text(args.out / "faults.json",
                      json.dumps({**asdict(result), "problems": found, "missed_target": missed}, indent=2))
    atomic_write_text(args.out / "faults.md", f"# Worker kill under load ({args.engine}, {model})\n\n{summary(result)}\n")
    print(f"{summary(result)}\nwrote {args.out}/faults.json, faults.md")
    if found or missed:
        raise FaultError("; ".join(found + missed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
