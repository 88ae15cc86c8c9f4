"""The Ray measurements' figures: hey's counts per phase, the checker's answers, the two-node run's recovery
times; written as results.json and results.md (a table, the CPU and the command). The autoscaler's own table is
in autoscale.py."""

from __future__ import annotations

import json
import platform
import re
from collections import Counter
from pathlib import Path

from contract.files import atomic_write_text

KILL_FAILURE_GOAL = 0.01  # at most 1 % of the requests sent during the kill fail; none after recovery
STATUS_LINE = re.compile(r"^\s*\[(\d+)\]\s+(\d+) responses", re.MULTILINE)
ERROR_LINE = re.compile(r"^\s*\[(\d+)\]\s+(.+)$", re.MULTILINE)


def hey_counts(output: str) -> dict:
    """{"sent", "ok", "failed", "statuses", "errors"} from hey's summary (its error lines: connection failures)."""
    statuses = {int(code): int(count) for code, count in STATUS_LINE.findall(output)}
    errors_text = output.split("Error distribution:", 1)[1] if "Error distribution:" in output else ""
    errors = {message.strip(): int(count) for count, message in ERROR_LINE.findall(errors_text)}
    ok = statuses.get(200, 0)
    sent = sum(statuses.values()) + sum(errors.values())
    if not sent:
        raise ValueError(f"hey reported no request: {output[-1000:]}")
    return {"sent": sent, "ok": ok, "failed": sent - ok, "statuses": statuses, "errors": errors}


def checked(records: list, start: float, end: float) -> dict:
    """The checker's answers in [start, end): how many, how many failed or were wrong, which nodes served."""
    inside = [r for r in records if start <= r[0] < end]
    return {"sent": len(inside), "failed": sum(1 for r in inside if r[1] != 200),
            "wrong": sum(1 for r in inside if r[3]), "nodes": dict(Counter(r[2] for r in inside if r[2]))}


def results(model: str, clients: int, second_node: str, placement: dict, placement_after: dict, phases: dict,
            records: list) -> dict:
    kill = phases["kill"]
    for phase in phases.values():
        phase["checker"] = checked(records, phase["started"], phase["ended"])
    return {"model": model, "clients": clients, "cpu": cpu_name(), "machine": platform.machine(),
            "second_node": second_node, "replicas_before": placement, "replicas_after": placement_after,
            "phases": phases,
            "seconds_until_noticed": None if kill["noticed_at"] is None else kill["noticed_at"] - kill["killed_at"],
            "seconds_until_every_replica_runs": (None if kill["recovered_at"] is None
                                                 else kill["recovered_at"] - kill["killed_at"]),
            "wrong_answers": sum(phase["checker"]["wrong"] for phase in phases.values())}


def goal_met(results: dict) -> bool:
    kill, after = results["phases"]["kill"], results["phases"]["after"]
    return (results["seconds_until_every_replica_runs"] is not None and results["wrong_answers"] == 0
            and kill["failed"] <= KILL_FAILURE_GOAL * kill["sent"] and after["failed"] == 0)


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def table(results: dict) -> str:
    rows = ["| phase | sent (hey) | failed | failure statuses / errors | checker: sent, failed, wrong | served by node |",
            "|---|---:|---:|---|---|---|"]
    for name, phase in results["phases"].items():
        failures = {**{str(k): v for k, v in phase["statuses"].items() if k != 200}, **phase["errors"]}
        check = phase["checker"]
        nodes = ", ".join(f"{node[:8]}: {count}" for node, count in check["nodes"].items())
        rows.append(f"| {name} | {phase['sent']} | {phase['failed']} | {failures or '-'} | "
                    f"{check['sent']}, {check['failed']}, {check['wrong']} | {nodes} |")
    noticed, recovered = results["seconds_until_noticed"], results["seconds_until_every_replica_runs"]
    return "\n".join(rows + [
        "",
        f"- second node: `{results['second_node']}`",
        f"- replicas before the kill (replica: node): {fmt(results['replicas_before'])}",
        f"- replicas after recovery (replica: node): {fmt(results['replicas_after'])}",
        f"- Serve saw a replica missing {seconds(noticed)} after the kill; every replica ran again {seconds(recovered)}"
        " after it",
        f"- wrong answers: {results['wrong_answers']}; goal (<= {KILL_FAILURE_GOAL:.0%} failed during the kill, none "
        f"after recovery, no wrong answer): {'met' if goal_met(results) else 'NOT met'}"])


def fmt(placement: dict) -> str:
    return ", ".join(f"{replica}: {node[:8]}" for replica, node in placement.items())


def seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def write(out: Path, results: dict, command: str) -> None:
    write_files(out, {**results, "command": command}, f"# A node killed under load: Ray Serve on two nodes\n\n"
                f"CPU: {results['cpu']}; {results['clients']} hey connections; model {results['model']}; "
                f"routing: {results['routing']}.\n\nCommand: `{command}`\n\n{table(results)}\n")


def write_files(out: Path, results: dict, markdown: str) -> None:
    """OUT/results.json and OUT/results.md, each whole or not at all."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "results.json", json.dumps(results, indent=2) + "\n")
    atomic_write_text(out / "results.md", markdown)
