"""The HTTP answer to a bad request row: RequestError carries its status and reason, and becomes
{"code": status, "error": reason} for that row only (TorchServe: handlers/image_classifier.py; KServe:
serving/kserve/app.py).

runtime.images says what is wrong with an image (contract.errors.ImageError and its ImageProblem, kept on the bottom
floor so that servers answering bad bodies import no torch); the status each problem gets is decided here, in the
request core's room.
"""

from __future__ import annotations

from contract.errors import ImageError, ImageProblem, VisionExportError

IMAGE_STATUS = {  # the HTTP status each refused image is answered with
    ImageProblem.NOT_AN_IMAGE: 415,  # Unsupported Media Type
    ImageProblem.UNSUPPORTED_FORMAT: 415,
    ImageProblem.TOO_LARGE: 413,  # Payload Too Large
    ImageProblem.TOO_SMALL: 400,  # Bad Request
    ImageProblem.CORRUPT: 400,
}


class RequestError(VisionExportError):
    """A bad request (or image): becomes {"code": code, "error": message} with that HTTP status for this row only."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    @classmethod
    def for_image(cls, error: ImageError) -> "RequestError":
        """The answer to an image the decoder refused: its problem's status, its message unchanged."""
        return cls(IMAGE_STATUS[error.problem], error.message)

    @classmethod
    def server_failure(cls, rid: str | None) -> "RequestError":
        """A 500 that names where the reason is (the log, under the request's id), never the exception's text: it may
        name files, addresses or a worker's state."""
        return cls(500, "the server failed to answer this request; its log has the reason"
                        + (f" under request id {rid}" if rid else ""))

    def as_response(self) -> dict:
        return {"code": self.code, "error": self.message}
