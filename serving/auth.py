"""One token authorisation for every engine (docs/security.md): the same switch (--token-auth, or
TS_DISABLE_TOKEN_AUTHORIZATION=false in the environment), the same key file (TorchServe's key_file.json in the run
dir: an inference key and a management key) and the same header (`Authorization: Bearer KEY`).

TorchServe writes and checks its keys itself. For KServe and Ray the engine writes the file before the server
starts (new keys at every start, mode 0600, never logged; or the file KEYS_ENV names, e.g. mounted in a container)
and hands its path to the server's processes in KEYS_ENV; they refuse a caller without the right key (refusal)."""

from __future__ import annotations

import functools
import hmac
import ipaddress
import json
import os
import secrets
from pathlib import Path

from serving.settings import ServingError, ServingSettings

INFERENCE, MANAGEMENT = "inference", "management"  # the two keys: predictions; versions, models, captured photos
KEYS_ENV = "VISION_EXPORT_KEY_FILE"  # the key file a server process of ours checks callers against
TOKEN_SWITCH_ENV = "TS_DISABLE_TOKEN_AUTHORIZATION"  # TorchServe's documented switch: "false" turns tokens on
KEY_BYTES = 24  # of randomness per key (32 URL-safe characters)
BEARER = "Bearer "
UNAUTHORISED = 401
VERSION_ROUTES = "/rollout"  # a server's version routes, a rollout's steps (KServe's app, Ray's server): management
FORBIDDEN = 403
LOOPBACK_ONLY = ("this route changes what is served: without token authorisation only this machine may call it; "
                 "switch tokens on (--token-auth) and send the management key")
TOKEN_HELP = ("refuse callers without a key: 'Authorization: Bearer KEY' with the inference key (predictions) or the "
              "management key (versions), from RUN_DIR/key_file.json (new at every start)")


class KeysNotWritten(ServingError):
    """Token authorisation is on and the server has not (yet) written a readable key file."""


def switched_on(flag: bool, environ: dict) -> bool:
    """Whether tokens are checked: --token-auth, TorchServe's own switch in the environment (the container's), or
    keys of your own given in KEYS_ENV."""
    return flag or environ.get(TOKEN_SWITCH_ENV, "").strip().lower() == "false" or bool(environ.get(KEYS_ENV))


def write_keys(path: Path) -> Path:
    """path as the key file of this start: the file KEYS_ENV names, linked, when one is given (a mounted secret,
    a volume's keys); else new keys, readable by this user only."""
    given = os.environ.get(KEYS_ENV)
    if given:
        read_keys(Path(given))  # a given file that holds no keys stops the start, naming it
        if Path(given).absolute() != path.absolute():
            path.unlink(missing_ok=True)
            path.symlink_to(Path(given).absolute())
        return path
    keys = {api: {"key": secrets.token_urlsafe(KEY_BYTES)} for api in (INFERENCE, MANAGEMENT)}
    return write_secret(path, json.dumps(keys))


def write_secret(path: Path, text: str) -> Path:
    """text as a new file path that only this user may read (whatever was there goes)."""
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)
    return path


def key_env(settings: ServingSettings) -> dict:
    """At launch: whether tokens are on is resolved (switched_on), and when they are the keys are written; the
    environment that hands their file to the server's processes ({} when off)."""
    settings.token_auth = switched_on(settings.token_auth, os.environ)
    if not settings.token_auth:
        settings.key_file.unlink(missing_ok=True)
        return {}
    return {KEYS_ENV: str(write_keys(settings.key_file))}


def key_notes(settings: ServingSettings) -> list[str]:
    """What a user is told once the server answers: where the keys are (never the keys)."""
    if not settings.token_auth:
        return []
    return [f"token authorisation on: keys (inference, management) in {settings.key_file}; anonymous requests "
            "are refused"]


def curl_header(settings: ServingSettings) -> str:
    return f' -H "Authorization: Bearer <inference key from {settings.key_file}>"' if settings.token_auth else ""


def read_keys(path: Path) -> dict[str, str]:
    """{api: key} of a key file (TorchServe's format: {"inference": {"key": ...}, "management": {"key": ...}})."""
    try:
        record = json.loads(Path(path).read_text())
    except FileNotFoundError as error:
        raise KeysNotWritten(f"token authorisation is on but the server has not written {path}") from error
    except (OSError, json.JSONDecodeError) as error:  # caught mid-write, or damaged
        raise KeysNotWritten(f"{path} cannot be read as a key file ({error})") from error
    keys = {api: record.get(api, {}).get("key") for api in (INFERENCE, MANAGEMENT) if isinstance(record, dict)}
    missing = [api for api in (INFERENCE, MANAGEMENT) if not isinstance(keys.get(api), str) or not keys[api]]
    if missing:
        raise ServingError(f"{path} has no {' and no '.join(missing)} key: a key file holds "
                           '{"inference": {"key": "..."}, "management": {"key": "..."}}')
    return keys


def auth_headers(settings: ServingSettings, api: str = INFERENCE) -> dict:
    """{"Authorization": "Bearer <key>"} for api's routes when token auth is on; {} when off."""
    if not settings.token_auth:
        return {}
    return {"Authorization": BEARER + read_keys(settings.key_file)[api]}


@functools.cache
def server_keys() -> dict[str, str] | None:
    """The keys this server process checks callers against (KEYS_ENV's file, read once); None: tokens off."""
    path = os.environ.get(KEYS_ENV)
    return read_keys(Path(path)) if path else None


def refusal(authorization: str | None, api: str, keys: dict[str, str] | None) -> str | None:
    """Why a caller sending this Authorization header may not call api's routes (None: it may). Compared in
    constant time, so the answer's timing does not tell how much of a guess was right."""
    if keys is None:
        return None
    given = (authorization or "").removeprefix(BEARER).strip() if (authorization or "").startswith(BEARER) else ""
    if given and hmac.compare_digest(given.encode(), keys[api].encode()):
        return None
    return (f"token authorisation is on: send the {api} key as 'Authorization: Bearer KEY' (it is in key_file.json "
            "of the server's run folder)")


def management_refusal(authorization: str | None, client_host: str | None) -> tuple[int, str] | None:
    """(status, why) when this caller may not call a route that changes what is served (None: it may): the
    management key with tokens on, a loopback client without them (as TorchServe's management API)."""
    keys = server_keys()
    if keys is None:
        return None if is_loopback(client_host) else (FORBIDDEN, LOOPBACK_ONLY)
    why = refusal(authorization, MANAGEMENT, keys)
    return None if why is None else (UNAUTHORISED, why)


def is_loopback(host: str | None) -> bool:
    try:
        return bool(host) and ipaddress.ip_address(host).is_loopback
    except ValueError:  # a Unix socket's or a test client's name
        return False


def refused_response(authorization: str | None, api: str = INFERENCE):
    """A 401 JSON answer for a caller this server process must refuse (server_keys), else None: what an ingress
    (Ray's deployment) calls first."""
    why = refusal(authorization, api, server_keys())
    if why is None:
        return None
    from starlette.responses import JSONResponse
    return JSONResponse({"code": UNAUTHORISED, "error": why}, status_code=UNAUTHORISED,
                        headers={"WWW-Authenticate": "Bearer"})
