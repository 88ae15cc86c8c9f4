"""Served rate with metrics and request ids on against off (VISION_SIGNALS=off), alternating rounds on one TorchServe
archive and load, each round its own server:
`python docs/results/2026-11-27-signals-cost/run.py MODEL_STORE MODEL [SECONDS] [CONCURRENCY] [ROUNDS]`."""

from __future__ import annotations

import json
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from handlers.metrics import SIGNALS_ENV
from serving.torchserve import server

CAT = Path(__file__).resolve().parents[3] / "examples" / "cat.jpg"


def cpu() -> str:
    text = Path("/proc/cpuinfo").read_text()
    return re.search(r"model name\s*:\s*(.*)", text).group(1) + f", {text.count('processor')} logical CPUs"


def served_rate(store: Path, model: str, signals: str, seconds: int, concurrency: int) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"signals-{signals}-") as run_dir:
        settings = server.on_free_ports(store, Path(run_dir))
        settings.model_name = model
        settings.extra_env = {SIGNALS_ENV: signals}
        with server.running(settings, CAT):
            subprocess.run(["hey", "-z", "5s", "-c", str(concurrency), "-m", "POST", "-T", "image/jpeg", "-D",
                            str(CAT), settings.predictions_url()], capture_output=True, check=True)  # warm-up
            done = subprocess.run(["hey", "-z", f"{seconds}s", "-c", str(concurrency), "-m", "POST", "-T",
                                   "image/jpeg", "-D", str(CAT), settings.predictions_url()], capture_output=True,
                                  text=True, check=True)
    rate = float(re.search(r"Requests/sec:\s*([0-9.]+)", done.stdout).group(1))
    return {"signals": signals, "req_per_s": rate, "hey": done.stdout}


def main(argv: list[str]) -> int:
    store, model = Path(argv[0]), argv[1]
    seconds, concurrency = int(argv[2]) if len(argv) > 2 else 30, int(argv[3]) if len(argv) > 3 else 4
    rounds = int(argv[4]) if len(argv) > 4 else 1
    # alternate which goes first, so a drift of the machine over the run falls on both sides alike
    order = [("on", "off") if r % 2 == 0 else ("off", "on") for r in range(rounds)]
    runs = [served_rate(store, model, signals, seconds, concurrency) for pair in order for signals in pair]
    on = statistics.median(r["req_per_s"] for r in runs if r["signals"] == "on")
    off = statistics.median(r["req_per_s"] for r in runs if r["signals"] == "off")
    print(json.dumps({"cpu": cpu(), "python": platform.python_version(), "model": model, "seconds": seconds,
                      "concurrency": concurrency, "rounds": rounds,
                      "per_round": [{"signals": r["signals"], "req_per_s": r["req_per_s"]} for r in runs],
                      "on_req_per_s_median": on, "off_req_per_s_median": off,
                      "cost_percent": round(100 * (off - on) / off, 2), "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
