"""A node killed under load on a two-node Ray Serve cluster: `python -m measure ray-two-node OUT`.

  python -m measure ray-two-node OUT [--model-store model-store] [--model NAME] [--clients 4]

Starts a head node and a second node on this machine (measure/distributed/cluster.py), the ray engine with one
replica on each, and shows where each replica runs (its node id, from the answers' X-Served-By). Then `hey`
keeps CLIENTS connections busy in three phases: steady load; the kill (the second node's processes SIGKILLed a
few seconds in, the phase lasting until Serve runs every replica again); and load after recovery. Beside hey,
one client checks every answer against the archive's artifact run in-process. Writes results.json and
results.md to OUT.
"""

from __future__ import annotations

import signal
import subprocess
import tempfile
import threading
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from handlers.logs import SERVED_BY
from measure.distributed import report
from measure.distributed.cluster import TWO_REPLICAS, two_node_serving
from measure.distributed.command import measured_model, ray_command_parser
from serving.ray import cluster
from serving.settings import EXAMPLE_IMAGE, REQUEST_TIMEOUT_S, ServingError

STEADY_S = 15  # load before the kill, and after recovery
KILL_AFTER_S = 3  # into the kill phase
GIVE_UP_S = 120  # a replica not back by then is reported as not recovered
ATOL = 1e-4  # probability difference that makes an answer wrong (tests/answers.py uses the same)
CONCURRENT_PROBES = 8  # requests at once when asking which replicas answer (two replicas take two each)


def replicas_by_node(url: str, image: bytes, replicas: int, rounds: int = 10) -> dict[str, str]:
    """{replica id: node id} of the replicas that answered, asked until `replicas` answered or rounds ran out.
    Requests go several at once: Serve's proxy prefers the replicas of its own node (the head's) and sends
    another node only what they cannot take (RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING)."""
    def ask(_) -> requests.Response:
        return requests.post(url, data=image, headers={"Content-Type": "image/jpeg"}, timeout=REQUEST_TIMEOUT_S)
    seen = {}
    with ThreadPoolExecutor(CONCURRENT_PROBES) as pool:
        for _ in range(rounds):
            for response in pool.map(ask, range(CONCURRENT_PROBES)):
                if response.status_code == 200:
                    node, replica = response.headers[SERVED_BY].split()
                    seen[replica] = node
            if len(seen) >= replicas:
                break
    return seen


def wait_for_replicas(model: str, replicas: int, timeout: float = GIVE_UP_S) -> None:
    """Every replica running (readiness asked one answer: another may still be loading its artifact)."""
    deadline = time.monotonic() + timeout
    while running_replicas(model) < replicas:
        if time.monotonic() > deadline:
            raise ServingError(f"{model}: {running_replicas(model)} of {replicas} replicas run after {timeout:.0f} s")
        time.sleep(0.5)


def running_replicas(model: str) -> int:
    deployment = deployment_status(model)
    return deployment.replica_states.get("RUNNING", 0) if deployment else 0


def deployment_status(model: str):
    """Serve's status of the model's deployment (its application and deployment are both named after it), or
    None while there is none."""
    from ray import serve
    application = serve.status().applications.get(model)
    return application.deployments.get(model) if application else None


class Checker(threading.Thread):
    """One client beside the load, pause_s between requests: every answer compared with the in-process one;
    (time, status, node, wrong, seconds it took)."""

    def __init__(self, url: str, image: bytes, expected: dict, pause_s: float = 0.0):
        super().__init__(daemon=True)
        self.url, self.image, self.expected, self.pause_s = url, image, expected, pause_s
        self.records: list[tuple[float, int, str, bool]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            sent = time.time()
            try:
                response = requests.post(self.url, data=self.image, headers={"Content-Type": "image/jpeg"},
                                         timeout=REQUEST_TIMEOUT_S)
                wrong = response.status_code == 200 and not same_answer(response.json(), self.expected)
                node = response.headers.get(SERVED_BY, " ").split()[0] if SERVED_BY in response.headers else ""
                self.records.append((time.time(), response.status_code, node, wrong, time.time() - sent))
            except requests.RequestException:
                self.records.append((time.time(), 0, "", False, time.time() - sent))
            self.stopping.wait(self.pause_s)


def same_answer(served: dict, expected: dict) -> bool:
    pairs = list(zip(served.get("predictions", []), expected["predictions"]))
    return (len(pairs) == len(expected["predictions"]) and served.get("artifact") == expected["artifact"]
            and all(p["index"] == q["index"] and abs(p["probability"] - q["probability"]) <= ATOL for p, q in pairs))


def expected_answer(archive: Path, image: bytes) -> dict:
    from handlers.core import ImageCore
    with tempfile.TemporaryDirectory(prefix="unpacked-") as folder:
        with zipfile.ZipFile(archive) as members:
            members.extractall(folder)
        return ImageCore.from_folder(folder, threads=1).answer(image)


def hey(url: str, image: Path, clients: int, seconds: float) -> subprocess.Popen:
    command = ["hey", "-z", f"{seconds:.0f}s", "-c", str(clients), "-m", "POST", "-T", "image/jpeg", "-D", str(image),
               "-t", str(REQUEST_TIMEOUT_S), url]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def steady_phase(url: str, image: Path, clients: int) -> dict:
    started = time.time()
    output = hey(url, image, clients, STEADY_S).communicate()[0]
    return {"started": started, "ended": time.time(), **report.hey_counts(output)}


def kill_phase(url: str, image: Path, clients: int, nodes, model: str) -> dict:
    """hey running; the second node SIGKILLed; hey stopped (SIGINT: it prints its report) once every replica runs
    again, or at GIVE_UP_S."""
    started = time.time()
    load = hey(url, image, clients, GIVE_UP_S + KILL_AFTER_S + STEADY_S)
    time.sleep(KILL_AFTER_S)
    killed_at = time.time()
    killed = cluster.kill_session(nodes.second.pid)
    noticed_at = recovered_at = None
    while time.time() - killed_at < GIVE_UP_S:
        running = running_replicas(model)
        if noticed_at is None and running < TWO_REPLICAS.workers:
            noticed_at = time.time()
        if noticed_at is not None and running >= TWO_REPLICAS.workers:
            recovered_at = time.time()
            break
        time.sleep(0.25)
    load.send_signal(signal.SIGINT)
    output = load.communicate()[0]
    return {"started": started, "ended": time.time(), "killed_at": killed_at, "processes_killed": len(killed),
            "noticed_at": noticed_at, "recovered_at": recovered_at, **report.hey_counts(output)}


def measure(model_store: Path, model: str, clients: int, even_routing: bool, image: Path = EXAMPLE_IMAGE) -> dict:
    archive = Path(model_store) / f"{model}.mar"
    expected = expected_answer(archive, image.read_bytes())
    with tempfile.TemporaryDirectory(prefix="ray2-", dir="/tmp") as folder:
        with two_node_serving(model_store, model, Path(folder), image, even_routing) as (nodes, settings):
            url = settings.predictions_url(model)
            second_node = nodes.second_node_id()
            wait_for_replicas(model, TWO_REPLICAS.workers)
            placement = replicas_by_node(url, image.read_bytes(), TWO_REPLICAS.workers)
            if second_node not in placement.values() or len(set(placement.values())) < 2:
                raise ServingError(f"the replicas are not on both nodes: {placement}")
            checker = Checker(url, image.read_bytes(), expected)
            checker.start()
            phases = {"before": steady_phase(url, image, clients),
                      "kill": kill_phase(url, image, clients, nodes, model),
                      "after": steady_phase(url, image, clients)}
            wait_for_replicas(model, TWO_REPLICAS.workers)
            placement_after = replicas_by_node(url, image.read_bytes(), TWO_REPLICAS.workers)
            checker.stopping.set()
            checker.join()
    return {**report.results(model, clients, second_node, placement, placement_after, phases, checker.records),
            "routing": "even" if even_routing else "Serve's default: the proxy's own node first"}


def main(argv: list[str]) -> int:
    parser = ray_command_parser("ray-two-node", __doc__)
    parser.add_argument("--clients", type=int, default=4, help="hey's concurrent connections")
    parser.add_argument("--even-routing", action="store_true", help="the proxy spreads requests over both nodes' "
                        "replicas (by default it prefers the head's own and the second node gets the overflow)")
    args = parser.parse_args(argv)
    from contract.cli import run_command
    return run_command(lambda: run(args))


def run(args) -> int:
    results = measure(args.model_store, measured_model(args), args.clients, args.even_routing)
    command = "python -m measure ray-two-node " + " ".join(str(a) for a in [args.out, "--model-store",
                                                                             args.model_store, "--clients", args.clients])
    command += " --even-routing" if args.even_routing else ""
    report.write(args.out, results, command)
    print(report.table(results))
    return 0 if report.goal_met(results) else 1


if __name__ == "__main__":
    import sys
    sys.exit(main(sys.argv[1:]))
