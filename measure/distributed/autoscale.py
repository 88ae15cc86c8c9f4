"""Serve's autoscaler under a load step: `python -m measure ray-autoscale OUT`.

  python -m measure ray-autoscale OUT [--model-store model-store] [--model NAME] [--clients 4] [--step 45]

Starts the ray engine with this machine's serving policy (serving/ray/config.py deployment_options: between one
replica and the policy's workers, one request in flight per replica as the target, AUTOSCALING_PACE). One
client sends a request at a time with a pause between them (the light load), throughout, and checks every
answer against the archive's artifact in-process.
Three phases, with a timestamp for every change of Serve's replica count:
  1. light load (the checker alone) after the start, until Serve is down to its minimum of replicas;
  2. the step: `hey` adds CLIENTS connections for STEP seconds, and Serve adds replicas up to the maximum;
  3. the step removed: light load again until Serve is back at its minimum.
Writes results.json, results.md and autoscale.png (replicas and the checker's latency over time) to OUT.
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

from measure.distributed import report
from measure.distributed.command import measured_model, ray_command_parser
from measure.distributed.two_node import Checker, deployment_status, expected_answer, hey
from serving.ray.config import AUTOSCALING_PACE, RaySettings, deployment_options
from serving.settings import EXAMPLE_IMAGE, ServingError, free_port, policy_with

POLL_S = 0.5  # how often Serve's status is read
# A scale-down is due downscale_delay_s after the load fell, judged over look_back_period_s: later is a failure.
SCALE_DOWN_GRACE_S = AUTOSCALING_PACE["downscale_delay_s"] + 2 * AUTOSCALING_PACE["look_back_period_s"] + 30
STEP_S = 45  # the load step: long enough for a scale-up (upscale_delay_s) and the replicas it adds to work
# The light load: the checker waits this long between requests, so about a third of a request is in flight,
# well under the target of one per replica (a client always in flight sits at the target, where Serve's
# rounding up of its average can hold a second replica).
LIGHT_PAUSE_S = 0.15


class ReplicaWatch(threading.Thread):
    """Serve's view of one deployment, read every POLL_S: [(time, running replicas, status, trigger)] on change."""

    def __init__(self, model: str):
        super().__init__(daemon=True)
        self.model, self.changes = model, []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            deployment = deployment_status(self.model)
            if deployment is not None:
                state = (deployment.replica_states.get("RUNNING", 0), str(deployment.status),
                         str(deployment.status_trigger))
                if not self.changes or self.changes[-1][1:] != state:
                    self.changes.append((time.time(), *state))
            time.sleep(POLL_S)

    def running(self) -> int:
        return self.changes[-1][1] if self.changes else 0

    def wait_for(self, replicas: int, timeout: float) -> float | None:
        """The time Serve first ran `replicas` replicas, waiting up to timeout; None if it did not."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.running() == replicas:
                return next(t for t, running, *_ in reversed(self.changes) if running == replicas)
            time.sleep(POLL_S)
        return None


def scaling(settings: RaySettings) -> dict:
    return deployment_options(settings.effective_policy())["autoscaling_config"]


def measure(model_store: Path, model: str, clients: int, step_s: float, workers: int | None,
            image: Path = EXAMPLE_IMAGE) -> dict:
    import ray

    from serving.ray.engine import RayServe
    expected = expected_answer(Path(model_store) / f"{model}.mar", image.read_bytes())
    with tempfile.TemporaryDirectory(prefix="ray-autoscale-", dir="/tmp") as folder:
        settings = RaySettings(model_store, (model,), http_port=free_port(), run_dir=Path(folder) / "engine",
                               policy=policy_with(workers=workers), signals_port=free_port())
        limits = scaling(settings)
        if limits["max_replicas"] <= limits["min_replicas"]:
            raise ServingError(f"the policy allows {limits['max_replicas']} replica(s): nothing to scale; "
                               "give --workers 2 or more")
        with RayServe(settings).running(image):
            ray.init(address=settings.address_file.read_text(), namespace="serve", logging_level="WARNING",
                     log_to_driver=False)
            try:
                watch = ReplicaWatch(model)
                checker = Checker(settings.predictions_url(model), image.read_bytes(), expected, LIGHT_PAUSE_S)
                watch.start()
                checker.start()
                phases = run_phases(settings.predictions_url(model), image, clients, step_s, limits, watch)
                checker.stopping.set()
                watch.stopping.set()
                checker.join()
                watch.join()
            finally:
                ray.shutdown()
    return results(model, clients, step_s, limits, settings.effective_policy().reason, phases, watch.changes,
                   checker.records)


def run_phases(url: str, image: Path, clients: int, step_s: float, limits: dict, watch: ReplicaWatch) -> dict:
    low, high = limits["min_replicas"], limits["max_replicas"]
    started = time.time()
    down_at = watch.wait_for(low, SCALE_DOWN_GRACE_S)
    light = {"started": started, "ended": time.time(), "reached_min_at": down_at}
    step_started = time.time()
    load = hey(url, image, clients, step_s)
    up_at = watch.wait_for(high, step_s)
    output = load.communicate()[0]
    step = {"started": step_started, "ended": time.time(), "reached_max_at": up_at, **report.hey_counts(output)}
    after = {"started": time.time(), "reached_min_at": watch.wait_for(low, SCALE_DOWN_GRACE_S)}
    after["ended"] = time.time()
    return {"light load after the start": light, "load step": step, "step removed": after}


def results(model: str, clients: int, step_s: float, limits: dict, policy: str, phases: dict, changes: list,
            records: list) -> dict:
    for phase in phases.values():
        phase["checker"] = report.checked(records, phase["started"], phase["ended"])
    step, after = phases["load step"], phases["step removed"]
    origin = phases["light load after the start"]["started"]
    return {"model": model, "clients": clients, "step_seconds": step_s, "cpu": report.cpu_name(), "policy": policy,
            "autoscaling_config": limits, "phases": phases,
            "replica_changes": [{"at_s": round(t - origin, 1), "running": running, "status": status,
                                 "trigger": trigger} for t, running, status, trigger in changes],
            "seconds_to_scale_up": None if step["reached_max_at"] is None else step["reached_max_at"] - step["started"],
            "seconds_to_scale_down": (None if after["reached_min_at"] is None
                                      else after["reached_min_at"] - after["started"]),
            "checker_latencies": [(round(r[0] - origin, 2), r[1], round(r[4], 4)) for r in records],
            "wrong_answers": sum(phase["checker"]["wrong"] for phase in phases.values()),
            "failed": sum(phase["checker"]["failed"] for phase in phases.values()) + step["failed"]}


def goal_met(results: dict) -> bool:
    return (results["seconds_to_scale_up"] is not None and results["seconds_to_scale_down"] is not None
            and results["failed"] == 0 and results["wrong_answers"] == 0)


def table(results: dict) -> str:
    origin = results["phases"]["light load after the start"]["started"]
    rows = ["| phase | from | to | replicas reached | hey sent, failed | checker: sent, failed, wrong, median ms |",
            "|---|---:|---:|---|---|---|"]
    for name, phase in results["phases"].items():
        reached = phase.get("reached_max_at", phase.get("reached_min_at"))
        target = "max" if "reached_max_at" in phase else "min"
        hey_cell = f"{phase['sent']}, {phase['failed']}" if "sent" in phase else "-"
        check = phase["checker"]
        latencies = sorted(lat for t, status, lat in results["checker_latencies"]
                           if phase["started"] - origin <= t < phase["ended"] - origin and status == 200)
        median = f"{1000 * latencies[len(latencies) // 2]:.0f}" if latencies else "-"
        rows.append(f"| {name} | {phase['started'] - origin:.1f} s | {phase['ended'] - origin:.1f} s | "
                    f"{target} at {'never' if reached is None else f'{reached - origin:.1f} s'} | {hey_cell} | "
                    f"{check['sent']}, {check['failed']}, {check['wrong']}, {median} |")
    changes = "; ".join(f"{c['at_s']:.1f} s: {c['running']} ({c['status']}, {c['trigger']})"
                        for c in results["replica_changes"])
    return "\n".join(rows + [
        "",
        f"- autoscaling: {results['autoscaling_config']}",
        f"- Serve's replica count over time (seconds from the start of phase 1): {changes}",
        (f"- scale-up {report.seconds(results['seconds_to_scale_up'])} after the step began; scale-down "
         f"{report.seconds(results['seconds_to_scale_down'])} after it ended"),
        (f"- failed requests: {results['failed']}; wrong answers: {results['wrong_answers']}; goal (both steps "
         f"seen, nothing failed, no wrong answer): {'met' if goal_met(results) else 'NOT met'}")])


def chart(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    origin = results["phases"]["light load after the start"]["started"]
    step = results["phases"]["load step"]
    end = results["phases"]["step removed"]["ended"] - origin
    changes = results["replica_changes"]
    figure, (replicas, latency) = plt.subplots(2, 1, sharex=True, figsize=(9, 5))
    replicas.step([c["at_s"] for c in changes] + [end], [c["running"] for c in changes] + [changes[-1]["running"]],
                  where="post")
    replicas.set_ylabel("running replicas")
    replicas.set_ylim(0, results["autoscaling_config"]["max_replicas"] + 0.5)
    ok = [(t, lat * 1000) for t, status, lat in results["checker_latencies"] if status == 200]
    latency.plot([t for t, _ in ok], [ms for _, ms in ok], ".", markersize=2)
    latency.set_ylabel("checker latency (ms)")
    latency.set_xlabel("seconds")
    for axis in (replicas, latency):
        axis.axvspan(step["started"] - origin, step["ended"] - origin, alpha=0.15, color="tab:orange",
                     label=f"hey -c {results['clients']}")
    replicas.legend(loc="upper right")
    replicas.set_title(f"Serve's autoscaler, {results['model']}, {results['cpu']}")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: list[str]) -> int:
    parser = ray_command_parser("ray-autoscale", __doc__)
    parser.add_argument("--clients", type=int, default=4, help="hey's connections during the step")
    parser.add_argument("--step", type=float, default=STEP_S, help="seconds of the load step")
    from contract.policy import add_policy_options
    add_policy_options(parser, ("workers",))  # the most replicas
    args = parser.parse_args(argv)
    from contract.cli import run_command
    return run_command(lambda: run(args))


def run(args) -> int:
    results = measure(args.model_store, measured_model(args), args.clients, args.step, args.workers)
    command = f"python -m measure ray-autoscale {args.out} --model-store {args.model_store} --clients {args.clients}"
    command += f" --step {args.step:g}" + (f" --workers {args.workers}" if args.workers else "")
    report.write_files(args.out, {**results, "command": command},
                       f"# Serve's autoscaler under a load step\n\nCPU: {results['cpu']}; model {results['model']}; "
                       f"policy: {results['policy']}.\n\nCommand: `{command}`\n\n{table(results)}\n")
    chart(results, args.out / "autoscale.png")
    print(table(results))
    return 0 if goal_met(results) else 1


if __name__ == "__main__":
    import sys
    sys.exit(main(sys.argv[1:]))
