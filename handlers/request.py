"""One request as every engine's adapter hands it to the core: its body, content type and headers as the engine
received them, and its id. The adapters (TorchServe's handlers/image_classifier.py, KServe's handlers/kserve_model.py,
Ray's serving/ray/deployment.py) build it from their own HTTP shapes; handlers/request_body.py finds the image and
the options in it; the core (handlers/core.py) sees nothing else.

    ImageRequest(body=b"<jpeg>", content_type="image/jpeg", headers={"x-topk": "3"})
    ImageRequest(fields={"data": "<base64>", "topk": 3}, content_type="application/json")  # a JSON object parsed
    ImageRequest.of_image(b"<jpeg>", topk=3)                                                # in-process callers
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping

REQUEST_ID_HEADER = "X-Request-ID"  # a client's or a proxy's id for its request; made here when absent
JSON_TYPE = "application/json"
# What a client's id may hold: enough for a UUID, a W3C trace id or a load balancer's own id, nothing that could
# forge another log line or a header.
ACCEPTED_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/+=-]{0,127}")


def request_id_of(headers: Mapping[str, str], fallback: str | None = None) -> str:
    """The X-Request-ID header's id when it is usable (ACCEPTED_ID), else `fallback` (an engine's own id), else a
    new one (a uuid4's 32 hex digits)."""
    given = ({name.lower(): value for name, value in headers.items()}.get(REQUEST_ID_HEADER.lower()) or "").strip()
    return given if ACCEPTED_ID.fullmatch(given) else fallback or uuid.uuid4().hex


@dataclass(frozen=True)
class ImageRequest:
    """body: the body's bytes as received (empty when the engine parsed it into fields); content_type: its media
    type, lower case, without parameters; headers: by lower-case name; fields: what the engine parsed the body
    into (a form's fields, a JSON object) or its protocol's per-image options (KServe's topk); request_id: the
    X-Request-ID header's, else one made for it."""

    body: bytes = b""
    content_type: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    fields: Mapping[str, Any] = field(default_factory=dict)
    request_id: str = ""

    def __post_init__(self):
        headers = {name.lower(): value for name, value in self.headers.items()}
        object.__setattr__(self, "headers", headers)
        object.__setattr__(self, "content_type", self.content_type.split(";")[0].strip().lower())
        if not self.request_id:
            object.__setattr__(self, "request_id", request_id_of(headers))

    @classmethod
    def of_image(cls, image: bytes, topk: int | None = None, headers: Mapping[str, str] | None = None,
                 request_id: str = "", **options) -> "ImageRequest":
        """A request of image bytes and options already apart (an in-process caller, KServe's protocols)."""
        asked = {name: value for name, value in {"topk": topk, **options}.items() if value is not None}
        return cls(image, "application/octet-stream", headers or {}, asked, request_id)

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    @property
    def is_json(self) -> bool:
        return self.content_type == JSON_TYPE
