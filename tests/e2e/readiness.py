"""A model's workers killed under traffic, readiness watched: the loop every engine's health test runs.

`watch_readiness` kills, keeps up to SENT requests in flight, and polls readiness until it has said no and then yes
again, within the engine's own limits; each test then holds the requests' answers to its own artifact (a 200 is the
artifact's answer, anything else a 5xx).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass

import requests

SENT = 8  # requests sent while the workers are down: enough to meet both a dead worker and its replacement
POLL_S = 0.5


@dataclass
class Outage:
    not_ready_after_s: float
    ready_after_s: float
    responses: list[requests.Response]


def watch_readiness(kill: Callable[[], None], send: Callable[[], requests.Response], ready_url: str,
                    lost_s: float, back_s: float, live_url: str | None = None) -> Outage:
    """kill(), then readiness must answer 503 within lost_s and 200 again within back_s (liveness, when given, 200
    throughout); the SENT requests sent meanwhile are waited for and returned."""
    assert requests.get(ready_url, timeout=30).status_code == 200
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        kill()
        killed, not_ready_at, sent = time.monotonic(), None, []
        while True:
            if len(sent) < SENT:
                sent.append(pool.submit(send))
            readiness = requests.get(ready_url, timeout=30)
            if live_url:
                assert requests.get(live_url, timeout=30).status_code == 200
            if readiness.status_code == 503 and not_ready_at is None:
                not_ready_at = time.monotonic()
                assert not_ready_at - killed <= lost_s, readiness.json()
            if readiness.status_code == 200 and not_ready_at is not None:
                break
            assert time.monotonic() - killed < back_s, f"not ready again in {back_s} s: {readiness.json()}"
            time.sleep(POLL_S)
        outage = Outage(not_ready_at - killed, time.monotonic() - killed, [future.result() for future in sent])
    print(f"\nnot ready {outage.not_ready_after_s:.1f} s after the kill, ready again after "
          f"{outage.ready_after_s:.1f} s")
    return outage
