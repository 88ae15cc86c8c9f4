"""Kill a worker under load and measure what it costs: `python -m measure faults`.

  python -m measure faults [--model-store model-store] [--model NAME] [--clients 4] [--out fault-results]

Starts TorchServe on free loopback ports with the archive (--model, default the store's only archive), waits until every worker is READY, keeps CLIENTS
threads sending predictions back to back, SIGKILLs one worker, and measures how many requests failed, how
long until TorchServe had every worker READY again (a new pid in the killed one's place), and whether every
request after that succeeded. Prints the figures, writes faults.json and faults.md to --out, and exits
non-zero when more requests failed than were in flight, recovery took longer than RECOVERY_LIMIT_S, or a
request after recovery failed. tests/e2e/test_faults.py runs the same measurement.
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
from measure.command import load_command_parser, load_command_settings, run_load_command
from measure.reliability.workers import ready_pids, wait_all_ready
from serving.settings import REQUEST_TIMEOUT_S
from serving.torchserve import server
from serving.torchserve.config import ServerSettings

RECOVERY_LIMIT_S = 15  # every worker READY again within 15 s of the kill
RESPAWN_LIMIT_S = 5  # TorchServe's own part: notice the death, wait its 1 s retry delay, start a new process
LOAD_BEFORE_KILL_S = 3  # steady load before the kill
LOAD_AFTER_RECOVERY_S = 3  # and after recovery: every one of these requests must succeed
GIVE_UP_S = 60  # a worker that is not back by then is reported as not recovered
POLL_S = 0.2
OK = "HTTP 200"


class FaultError(VisionExportError):
    """The server did not recover from the fault as required; the message carries the numbers."""


@dataclass
class KillResult:
    clients: int
    requests: int  # answered or failed, over the whole run
    failed: int  # non-200 answers and requests that got no answer
    recovery_s: float  # from the kill until every worker was READY again
    respawn_s: float | None  # from the kill until the replacement process started (None: no replacement seen)
    recovered: bool
    requests_after_recovery: int
    failed_after_recovery: int
    killed_pid: int
    pids_before: list
    pids_after: list
    outcomes: dict = field(default_factory=dict)  # "HTTP 200", "HTTP 503", "ConnectionError", ... -> count


def problems(result: KillResult) -> list[str]:
    found = []
    if not result.recovered:
        found.append(f"worker {result.killed_pid} was not replaced within {GIVE_UP_S} s")
    elif result.recovery_s > RECOVERY_LIMIT_S:
        found.append(f"recovery took {result.recovery_s:.1f} s (limit {RECOVERY_LIMIT_S} s)")
    if result.failed > result.clients:
        found.append(f"{result.failed} requests failed, more than the {result.clients} that could be in flight")
    if result.recovered and not result.requests_after_recovery:
        found.append("no request was answered after recovery")
    elif result.failed_after_recovery:
        found.append(f"{result.failed_after_recovery} of {result.requests_after_recovery} requests after "
                     f"recovery failed")
    return found


def summary(result: KillResult) -> str:
    if result.respawn_s is None:
        recovery = f"no replacement worker within {GIVE_UP_S} s"
    else:
        recovery = (f"every worker READY again {result.recovery_s:.1f} s after the kill (limit {RECOVERY_LIMIT_S} s): "
                    f"replacement started after {result.respawn_s:.1f} s, then "
                    f"{result.recovery_s - result.respawn_s:.1f} s to start Python and load the model")
    return (f"worker kill: {result.failed} of {result.requests} requests failed ({result.clients} clients); "
            f"{recovery}; {result.failed_after_recovery} of {result.requests_after_recovery} later requests failed"
            + (f" (outcomes: {', '.join(f'{k} x{n}' for k, n in sorted(result.outcomes.items()))})"
               if result.outcomes else ""))


def process_start_s(pid: int) -> float:
    """When a process started, in CLOCK_BOOTTIME seconds (field 22 of /proc/PID/stat, in clock ticks)."""
    after_name = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # fields 3 onwards
    return int(after_name[19]) / os.sysconf("SC_CLK_TCK")


def predict(settings: ServerSettings, body: bytes) -> str:
    """One request's outcome: "HTTP <status>", or the kind of error that left it unanswered."""
    headers = {"Content-Type": "image/jpeg", **server.auth_headers(settings)}
    try:
        response = requests.post(settings.predictions_url(), data=body, timeout=REQUEST_TIMEOUT_S, headers=headers)
    except requests.RequestException as error:  # the kill's expected cost: counted by kind, never raised
        return type(error).__name__
    return f"HTTP {response.status_code}"


def kill_worker_under_load(settings: ServerSettings, image: Path, clients: int) -> KillResult:
    """On a running server: load, SIGKILL one worker, wait for its replacement, load on; the figures."""
    before = wait_all_ready(settings, FaultError)
    body = image.read_bytes()
    outcomes: list[tuple[float, str]] = []  # (time the answer came, outcome); list.append is thread-safe
    stop = threading.Event()

    def keep_sending():
        while not stop.is_set():
            outcome = predict(settings, body)
            outcomes.append((time.monotonic(), outcome))

    with ThreadPoolExecutor(clients) as pool:
        for _ in range(clients):
            pool.submit(keep_sending)
        time.sleep(LOAD_BEFORE_KILL_S)
        killed_at, killed_boot_s = time.monotonic(), time.clock_gettime(time.CLOCK_BOOTTIME)
        os.kill(before[0], signal.SIGKILL)
        back_at, recovered = killed_at + GIVE_UP_S, False
        while time.monotonic() < killed_at + GIVE_UP_S:
            pids = ready_pids(settings)
            if before[0] not in pids and len(pids) == len(before):
                back_at, recovered = time.monotonic(), True
                break
            time.sleep(POLL_S)
        time.sleep(LOAD_AFTER_RECOVERY_S)
        stop.set()
    after = ready_pids(settings)
    later = [outcome for t, outcome in outcomes if t > back_at]
    replacements = [pid for pid in after if pid not in before]
    respawn_s = round(process_start_s(replacements[0]) - killed_boot_s, 2) if recovered and replacements else None
    return KillResult(clients, len(outcomes), sum(outcome != OK for _, outcome in outcomes),
                      round(back_at - killed_at, 2), respawn_s, recovered, len(later),
                      sum(outcome != OK for outcome in later), before[0], before, after,
                      dict(Counter(outcome for _, outcome in outcomes)))


def main(argv: list[str] | None = None) -> int:
    return run_load_command(lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    parser = load_command_parser("faults", __doc__, out="fault-results")
    parser.add_argument("--clients", type=int, default=4, help="threads sending back to back (default 4)")
    args = parser.parse_args(argv)
    if args.clients < 1:
        raise FaultError("--clients must be at least 1")
    settings = load_command_settings(args)
    with server.running(settings, args.image):
        result = kill_worker_under_load(settings, args.image, args.clients)
    found = problems(result)
    atomic_write_text(args.out / "faults.json", json.dumps({**asdict(result), "problems": found}, indent=2))
    atomic_write_text(args.out / "faults.md", f"# Worker kill under load ({settings.model_name})\n\n{summary(result)}\n")
    print(f"{summary(result)}\nwrote {args.out}/faults.json, faults.md")
    if found:
        raise FaultError("; ".join(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
