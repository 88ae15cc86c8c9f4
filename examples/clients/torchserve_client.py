"""Send an image to TorchServe's /predictions endpoint (python -m serving, docker compose up).

    python -m examples.clients.torchserve_client examples/cat.jpg --url http://127.0.0.1:8080 [--token KEY]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import requests

from examples.clients import DEFAULT_MODEL


def predict(url: str, image: Path, model: str = DEFAULT_MODEL, token: str | None = None,
            timeout: float = 30) -> dict:
    """The handler's answer: {"predictions": [{"label", "index", "probability"}, ...], "model", "artifact"}."""
    headers = {"Content-Type": "image/jpeg", **({"Authorization": f"Bearer {token}"} if token else {})}
    response = requests.post(f"{url}/predictions/{model}", data=Path(image).read_bytes(), headers=headers,
                             timeout=timeout)
    response.raise_for_status()
    return response.json()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("image", type=Path)
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"the archive's name (default: {DEFAULT_MODEL})")
    parser.add_argument("--token", default=None, help="inference key when token authorisation is on")
    args = parser.parse_args()
    print(json.dumps(predict(args.url, args.image, args.model, args.token), indent=1))
