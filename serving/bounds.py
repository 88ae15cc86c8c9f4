"""What our own HTTP servers read from a client, bounded: one body limit (contract/policy.py's MAX_BODY_BYTES, the
limit TorchServe's shipped config sets too), a read timeout, and a cap on the connections served at once.

- http.server's servers (the try-it page, the signals server): BoundedHTTPServer answers a connection past
  MAX_CONNECTIONS with 503 at once, and every socket read waits at most READ_TIMEOUT_S; read_body() refuses a
  missing, negative or oversized Content-Length (411/413) before reading a byte of the body, and counts a chunked
  body as it arrives, cutting it at the limit.
- ASGI apps (KServe's; Ray's ingress through bounded_body): a declared Content-Length over the limit is refused
  with 413 before the body is read, a chunked one is cut at the limit, so no route parses more than it, and a
  client that stops sending is answered 408 (the ASGI servers time out no body).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from contract.policy import MAX_BODY_BYTES
from handlers.request_error import RequestError

logger = logging.getLogger("serving.bounds")

READ_TIMEOUT_S = 30  # the longest a server waits for a client's next bytes
BODY_DEADLINE_S = 120  # the longest one body may take to arrive (8 MiB on a slow link), whatever its pace
MAX_CONNECTIONS = 32  # connections served at once by one http.server; the next is answered 503
READ_CHUNK = 64 * 1024
LINGER_S = 2  # after refusing a body unread: how long its rest is read and dropped, so the answer is not lost
LINGER_BYTES = MAX_BODY_BYTES  # and how much of it at most (dropped as it comes: nothing is held)
BUSY = b'{"message": "this server is answering as many connections as it serves at once: try again shortly"}'


def mebibytes(size: int) -> str:
    return f"{size / 2**20:g} MiB"


def too_large(limit: int = MAX_BODY_BYTES) -> RequestError:
    return RequestError(413, f"the request body is over {mebibytes(limit)} ({limit} bytes), the limit of every "
                             "server here: send a smaller photo")


class BoundedHTTPServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer serving at most max_connections connections at once (each in its thread); one past
    them is answered 503 and closed, from the accepting thread, without a thread of its own."""

    daemon_threads = True

    def __init__(self, address, handler, max_connections: int = MAX_CONNECTIONS, read_timeout: float = READ_TIMEOUT_S):
        self.slots = threading.BoundedSemaphore(max_connections)
        self.read_timeout = read_timeout
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        if not self.slots.acquire(blocking=False):
            self._busy(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()  # no thread was started to release it
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def _busy(self, request) -> None:
        try:
            request.settimeout(1)  # a client that reads nothing cannot hold the accepting thread
            request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                            b"Retry-After: 1\r\nConnection: close\r\n"
                            + f"Content-Length: {len(BUSY)}\r\n\r\n".encode() + BUSY)
        except OSError as error:  # the client went away: nothing to answer
            logger.debug("a busy answer was not delivered: %s", error)
        finally:
            self.shutdown_request(request)


class BoundedHandler(BaseHTTPRequestHandler):
    """http.server's handler with every socket read bounded by its server's read timeout (a silent client is
    dropped). A request answered before its body was read sets `unread`: the connection closes after its answer."""

    unread = False

    def setup(self) -> None:
        self.timeout = getattr(self.server, "read_timeout", READ_TIMEOUT_S)
        super().setup()

    def refused_unread(self) -> None:
        self.unread = self.close_connection = True

    def finish(self) -> None:
        super().finish()
        if self.unread:
            linger(self.connection)


def linger(connection: socket.socket) -> None:
    """Closing a socket with unread bytes resets the connection, and a client still sending may lose the answer:
    say we are done, then drop what still arrives, for at most LINGER_S and LINGER_BYTES."""
    deadline, dropped = time.monotonic() + LINGER_S, 0
    try:
        connection.shutdown(socket.SHUT_WR)
        while time.monotonic() < deadline and dropped < LINGER_BYTES:
            connection.settimeout(max(0.01, deadline - time.monotonic()))
            part = connection.recv(READ_CHUNK)
            if not part:
                return
            dropped += len(part)
    except OSError:  # the client has gone or kept sending past LINGER_S: closing ends it
        return


def declared_length(content_length: str | None, chunked: bool, limit: int = MAX_BODY_BYTES) -> int | None:
    """The body's declared size (None: chunked), or a RequestError: 411 when it is missing or not a size, 413
    when it is over the limit."""
    if chunked:
        return None
    if content_length is None:
        raise RequestError(411, "a Content-Length is required (or Transfer-Encoding: chunked)")
    try:
        length = int(content_length.strip())
    except ValueError:
        length = -1
    if length < 0:
        raise RequestError(411, f"Content-Length must be a size in bytes, got {content_length!r}")
    if length > limit:
        raise too_large(limit)
    return length


def read_body(handler: BoundedHandler, limit: int = MAX_BODY_BYTES) -> bytes:
    """The request's body, read only once its size is known to be within the limit (a chunked body: counted as
    its chunks arrive); a RequestError (411, 413, 408) otherwise, after which the connection is closed."""
    chunked = "chunked" in handler.headers.get("Transfer-Encoding", "").lower()
    try:
        length = declared_length(handler.headers.get("Content-Length"), chunked, limit)
        deadline = time.monotonic() + BODY_DEADLINE_S
        return _read_chunked(handler.rfile, limit, deadline) if length is None else _read(handler.rfile, length,
                                                                                          deadline)
    except RequestError:
        handler.refused_unread()  # what is left of the body is never read
        raise


def _read(stream, size: int, deadline: float) -> bytes:
    parts, left = [], size
    while left:
        if time.monotonic() > deadline:
            raise RequestError(408, f"the body did not arrive within {BODY_DEADLINE_S} s")
        try:
            part = stream.read1(min(left, READ_CHUNK))
        except TimeoutError:
            raise RequestError(408, "the client stopped sending its body") from None
        if not part:
            raise RequestError(400, f"the body ended after {size - left} of its {size} bytes")
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def _read_chunked(stream, limit: int, deadline: float) -> bytes:
    """A chunked body (RFC 9112 7.1), refused with 413 as soon as its chunks add up past the limit."""
    parts, total = [], 0
    while True:
        try:
            size_line = stream.readline(1024)
        except TimeoutError:
            raise RequestError(408, "the client stopped sending its body") from None
        try:
            size = int(size_line.split(b";")[0].strip(), 16)
        except ValueError:
            raise RequestError(400, f"a chunk's size is not hexadecimal: {size_line[:40]!r}") from None
        if size == 0:
            _read(stream, 2, deadline)  # the last chunk's CRLF (no trailers are sent by clients we serve)
            return b"".join(parts)
        total += size
        if total > limit:
            raise too_large(limit)
        parts.append(_read(stream, size, deadline))
        _read(stream, 2, deadline)  # the CRLF after each chunk


# ---------------------------------------------------------------- ASGI
class BodyLimit:
    """ASGI middleware: an HTTP request whose declared body is over the limit is answered 413 before the app reads
    it; a body without a declared size is counted as it arrives and answered 413 once it passes the limit."""

    def __init__(self, app, limit: int = MAX_BODY_BYTES):
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        async def chunks():
            more = True
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                yield message.get("body", b"")
                more = message.get("more_body", False)
        declared = dict(scope["headers"]).get(b"content-length", b"").decode("latin-1")
        try:  # at most the limit is held: the app then reads it from here
            body = await bounded_body(chunks(), declared, self.limit)
        except RequestError as error:
            return await refuse(send, error)
        replayed = [{"type": "http.request", "body": body, "more_body": False}]

        async def replay():
            return replayed.pop() if replayed else await receive()
        return await self.app(scope, replay, send)


async def bounded_body(chunks: AsyncIterator[bytes], declared: str | None, limit: int = MAX_BODY_BYTES,
                       read_timeout: float = READ_TIMEOUT_S) -> bytes:
    """The body an ASGI server hands over in chunks, or a 413 RequestError: at once when its declared size is over
    the limit (nothing read), else as soon as the chunks that arrived add up past it; 408 when the client stops
    sending for read_timeout or takes over BODY_DEADLINE_S (the ASGI servers time out no body)."""
    if declared and declared.strip().isdigit() and int(declared) > limit:
        raise too_large(limit)
    parts, total, deadline = [], 0, time.monotonic() + BODY_DEADLINE_S
    iterator = aiter(chunks)
    while True:
        wait = min(read_timeout, deadline - time.monotonic())
        try:
            chunk = await asyncio.wait_for(anext(iterator), max(wait, 0.001))
        except StopAsyncIteration:
            break
        except TimeoutError:
            raise RequestError(408, "the client stopped sending its body") from None
        total += len(chunk)
        if total > limit:
            raise too_large(limit)
        parts.append(chunk)
    return b"".join(parts)


async def refuse(send, error: RequestError) -> None:
    body = json.dumps(error.as_response()).encode()
    await send({"type": "http.response.start", "status": error.code,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
