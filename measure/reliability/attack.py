"""`python -m measure attack URL --pid PID`: the reads an attacker on the same network can send a running server,
and whether it stayed within a memory bound and kept answering a normal request.

    python -m measure attack http://127.0.0.1:8090/predictions/resnet18 --pid 4242 --photo examples/cat.jpg

Each attack on a fresh connection, one after another, the normal request sent after each:
- length -1: `Content-Length: -1`, then a stream of bytes (a server that reads "until the client stops" holds it);
- oversized: a declared Content-Length far over the limit, then the bytes it promised;
- chunked: Transfer-Encoding: chunked, chunks far past the limit;
- slow sender: a head and a few body bytes, then silence (how long the server holds the connection);
- many connections: idle connections opened and held while the normal request is sent.
It reports, per attack, the answer's status, how many bytes the server took before answering or closing, the
seconds it took, the normal request's status and time, and the peak memory of the server's process tree (PID
and its descendants, sampled). The exit code is 0 when every normal request was answered 200 and the peak stayed
within --memory-bound-mb of the memory before; 1 otherwise. Raw JSON lines with --out.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

STREAM_MIB = 600  # what the stream attacks offer: far past any limit of ours
CHUNK = 2**20
SLOW_WAIT_S = 60  # how long the slow sender waits for the server to drop it
IDLE_CONNECTIONS = 200
CONNECT_PACE_S = 0.01
SAMPLE_S = 0.2
ANSWER_S = 120  # the normal request's timeout


def tree_rss_mb(pid: int) -> float:
    """Resident memory of pid and every descendant, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        todo.extend(children.get(current, []))
        try:
            status = Path(f"/proc/{current}/status").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return total / 1024


class Peak:
    """The tree's peak RSS while a `with` block runs."""

    def __init__(self, pid: int):
        self.pid, self.peak, self.done = pid, 0.0, threading.Event()

    def __enter__(self) -> Peak:
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while not self.done.is_set():
            self.peak = max(self.peak, tree_rss_mb(self.pid))
            self.done.wait(SAMPLE_S)

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()


class Target:
    def __init__(self, url: str, photo: bytes, content_type: str, headers: dict[str, str], method: str = "POST"):
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.path = parts.path + (f"?{parts.query}" if parts.query else "")
        self.photo, self.content_type, self.headers, self.method = photo, content_type, headers, method

    def head(self, extra: str) -> bytes:
        own = "".join(f"{k}: {v}\r\n" for k, v in self.headers.items())
        return (f"{self.method} {self.path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: {self.content_type}\r\n"
                f"{own}{extra}\r\n").encode()

    def connect(self, timeout: float = 30) -> socket.socket:
        return socket.create_connection((self.host, self.port), timeout=timeout)

    def normal(self) -> dict:
        """The photo as a client sends it: status and seconds."""
        started = time.monotonic()
        body = self.photo if self.method == "POST" else b""  # GET: a health or metrics route
        try:
            with self.connect(ANSWER_S) as connection:
                connection.sendall(self.head(f"Content-Length: {len(body)}\r\nConnection: close\r\n") + body)
                status = status_of(read_answer(connection))
        except OSError as error:
            status = f"no answer: {error}"
        return {"status": status, "seconds": round(time.monotonic() - started, 2)}


def read_answer(connection: socket.socket) -> bytes:
    """The answer's head and its Content-Length of body (a server may keep the connection open after it)."""
    answer = b""
    try:
        while chunk := connection.recv(65536):
            answer += chunk
            if complete(answer):
                break
    except OSError:  # reset after its answer, or a timeout: what arrived is the answer
        pass
    return answer


def complete(answer: bytes) -> bool:
    head, found, body = answer.partition(b"\r\n\r\n")
    if not found:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return len(body) >= int(value)
    return False  # no length: the answer ends when the connection does


def status_of(answer: bytes) -> int | str:
    try:
        return int(answer.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return "closed without an answer" if not answer else f"unreadable: {answer[:40]!r}"


def stream(target: Target, extra: str, chunked: bool = False) -> dict:
    """Send a head, then up to STREAM_MIB in chunks while the server takes them: its answer, the bytes taken."""
    started, sent = time.monotonic(), 0
    with target.connect() as connection:
        connection.sendall(target.head(extra))
        block = (f"{CHUNK:x}\r\n".encode() + b"x" * CHUNK + b"\r\n") if chunked else b"x" * CHUNK
        connection.settimeout(5)
        for _ in range(STREAM_MIB):
            try:
                connection.sendall(block)
            except OSError:  # the server stopped reading: answered and closed, or reset
                break
            sent += CHUNK
        connection.settimeout(30)
        answer = read_answer(connection)
    return {"status": status_of(answer), "mib_sent": round(sent / 2**20, 1),
            "seconds": round(time.monotonic() - started, 2)}


def slow(target: Target) -> dict:
    started = time.monotonic()
    with target.connect(SLOW_WAIT_S) as connection:
        connection.sendall(target.head("Content-Length: 1000\r\n") + b"just this")
        answer = read_answer(connection)
    held = time.monotonic() - started
    return {"status": status_of(answer), "held_s": round(held, 1), "dropped": held < SLOW_WAIT_S - 1}


def many(target: Target) -> dict:
    """IDLE_CONNECTIONS opened at a pace the server's accept queue takes (an overflowing queue would leave
    some never accepted), then the normal request while they are held; each then says what became of it."""
    opened, refused = [], 0
    for _ in range(IDLE_CONNECTIONS):
        try:
            opened.append(target.connect(5))
        except OSError:
            refused += 1
        time.sleep(CONNECT_PACE_S)
    time.sleep(1)
    normal = target.normal()
    fates = {"held": 0, "answered": 0, "closed": 0}
    for connection in opened:
        connection.settimeout(0.05)
        try:
            data = connection.recv(64)
            fates["answered" if data else "closed"] += 1
        except TimeoutError:
            fates["held"] += 1  # still waiting on the server: a thread or task of it held
        except OSError:
            fates["closed"] += 1
        connection.close()
    return {"opened": len(opened), "refused": refused, **fates, "normal_while_held": normal}


ATTACKS = {
    "length-minus-1": lambda t: stream(t, "Content-Length: -1\r\n"),
    "oversized": lambda t: stream(t, f"Content-Length: {STREAM_MIB * CHUNK}\r\n"),
    "chunked": lambda t: stream(t, "Transfer-Encoding: chunked\r\n", chunked=True),
    "slow-sender": slow,
    "many-connections": many,
}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m measure attack", description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="a prediction URL that takes the photo as the body, e.g. .../predictions/NAME")
    parser.add_argument("--pid", type=int, required=True, help="the server's process (its descendants counted too)")
    parser.add_argument("--photo", type=Path, default=Path("examples/cat.jpg"))
    parser.add_argument("--content-type", default="image/jpeg")
    parser.add_argument("--method", choices=("POST", "GET"), default="POST",
                        help="GET: a route without a body (a signals server's /health/ready); the attacks still send one")
    parser.add_argument("--header", action="append", default=[], help="'Name: value' added to every request")
    parser.add_argument("--memory-bound-mb", type=float, default=256, help="growth over the start allowed")
    parser.add_argument("--attacks", nargs="+", choices=list(ATTACKS), default=list(ATTACKS))
    parser.add_argument("--out", type=Path, default=None, help="JSON lines, one per attack")
    args = parser.parse_args(argv)
    headers = dict(h.split(":", 1) for h in args.header)
    target = Target(args.url, args.photo.read_bytes(), args.content_type,
                    {k.strip(): v.strip() for k, v in headers.items()}, args.method)
    before, rows = tree_rss_mb(args.pid), []
    first = target.normal()
    print(f"server tree {before:.0f} MB before; a normal request: {first}", flush=True)
    for name in args.attacks:
        with Peak(args.pid) as peak:
            found = ATTACKS[name](target)
        row = {"attack": name, **found, "normal_after": target.normal(), "peak_mb": round(peak.peak),
               "growth_mb": round(peak.peak - before)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    answered = all(row["normal_after"]["status"] == 200 for row in rows) and first["status"] == 200
    bounded = all(row["growth_mb"] <= args.memory_bound_mb for row in rows)
    print(f"kept answering: {answered}; memory within {args.memory_bound_mb:g} MB of the start: {bounded} "
          f"(peak growth {max((r['growth_mb'] for r in rows), default=0)} MB)", flush=True)
    return 0 if answered and bounded else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
