"""Every port a start will bind, checked before anything starts: each engine names its ports with the flag that
sets each (Engine.ports), the command line adds the try-it page's, and Engine.start binds each on its host and
closes it at once. A port another process holds fails the start there, with the port and the flag to change,
rather than as a server that starts "successfully" while one of its parts dies on "Address already in use" (only
in its log) and the address printed is another server's.

A port of 0 is the OS's choice at bind time: nothing to check."""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass

from serving.settings import ServingError


@dataclass(frozen=True)
class Port:
    flag: str  # the option that sets it: what the user passes to choose another
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


class PortInUse(ServingError):
    """A port the start would bind is held (or cannot be bound); the message names it and the flag that sets it."""


def check_ports(ports: list[Port]) -> None:
    """PortInUse for the first port given twice or that cannot be bound now; nothing is left bound."""
    chosen = [port for port in ports if port.port]
    seen: dict[int, Port] = {}
    for port in chosen:  # one number twice: the second bind would fail, whichever part of the server makes it
        if port.port in seen:
            raise PortInUse(f"port {port.port} is given to both {seen[port.port].flag} and {port.flag}: each needs "
                            f"its own; pass another {port.flag}")
        seen[port.port] = port
    for port in chosen:
        error = bind_error(port.host, port.port)
        if error is not None:
            raise PortInUse(refusal(port, error))


def refusal(port: Port, error: OSError) -> str:
    if error.errno == errno.EADDRINUSE:
        return (f"port {port.port} ({port.flag}) is in use on {port.host}: stop what holds it or pass another "
                f"{port.flag}")
    return f"cannot bind {port.address} ({port.flag}): {error.strerror or error}; pass another {port.flag} or host"


def bind_error(host: str, port: int) -> OSError | None:
    """The error binding host:port gives now (another server holds it), or None; the probe is closed at once.
    SO_REUSEADDR as servers set it: a port a stopped server left in TIME_WAIT is free, a listening one is not."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as error:
        return OSError(errno.EADDRNOTAVAIL, f"no such address ({error.strerror})")
    probe = socket.socket(family, kind, proto)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(address)
    except OSError as error:
        return error
    finally:
        probe.close()
    return None
