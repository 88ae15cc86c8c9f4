"""Who may call which route of our KServe server (docs/security.md), decided here for every route, KServe's own
included: deny by default.

- anyone: liveness, readiness and metrics (OPEN);
- the management key: what changes or reads a version, a served model or a captured photo (MANAGEMENT_PREFIXES:
  the rollout's routes, KServe's model repository load/unload); with tokens off, loopback clients only;
- the inference key: everything else (predictions, model metadata, KServe's OpenAPI page).

Tokens are on when the engine handed the server a key file (serving/auth.py KEYS_ENV)."""

from __future__ import annotations

import json

from serving import auth

OPEN = frozenset({"/", "/metrics", "/health/live", "/health/ready", "/v2/health/live", "/v2/health/ready"})
MANAGEMENT_PREFIXES = (f"{auth.VERSION_ROUTES}/", "/v2/repository/")


def api_of(path: str) -> str | None:
    """The key a route asks for (serving/auth.py INFERENCE or MANAGEMENT); None: anyone may call it."""
    path = path.rstrip("/") or "/"
    if path in OPEN:
        return None
    return auth.MANAGEMENT if path.startswith(MANAGEMENT_PREFIXES) else auth.INFERENCE


def loopback(scope) -> bool:
    client = scope.get("client")
    return auth.is_loopback(client[0] if client else None)


class TokenAuth:
    """ASGI middleware: a caller without the key its route asks for is answered 401 before the body is read."""

    def __init__(self, app):
        self.app = app
        self.keys = auth.server_keys()  # read at start: a key file that cannot be read stops the server

    async def __call__(self, scope, receive, send):
        api = api_of(scope["path"]) if scope["type"] == "http" else None
        if api is None:
            return await self.app(scope, receive, send)
        if self.keys is None:
            if api == auth.MANAGEMENT and not loopback(scope):
                return await answer(send, auth.FORBIDDEN, auth.LOOPBACK_ONLY)
            return await self.app(scope, receive, send)
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        why = auth.refusal(header, api, self.keys)
        if why is not None:
            return await answer(send, auth.UNAUTHORISED, why)
        return await self.app(scope, receive, send)


async def answer(send, status: int, why: str) -> None:
    body = json.dumps({"code": status, "error": why}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == auth.UNAUTHORISED:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
