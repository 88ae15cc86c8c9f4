"""Send an image to a KServe InferenceService (TorchServe runtime, v1 protocol): base64 in "instances".

    python -m examples.clients.kserve_v1_client examples/cat.jpg --url http://resnet50.default.example.com
"""

from __future__ import annotations

import argparse
import base64
import json
from pathlib import Path

import requests

from examples.clients import DEFAULT_MODEL


def v1_request(image: Path) -> dict:
    return {"instances": [{"data": base64.b64encode(Path(image).read_bytes()).decode("ascii")}]}


def predict(url: str, image: Path, model: str = DEFAULT_MODEL, timeout: float = 30) -> list[dict]:
    """Top-k of the one instance sent (KServe answers {"predictions": [<the handler's answer>]})."""
    response = requests.post(f"{url}/v1/models/{model}:predict", json=v1_request(image), timeout=timeout)
    response.raise_for_status()
    (answer,) = response.json()["predictions"]  # one instance sent, one answer
    return answer["predictions"]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("image", type=Path)
    parser.add_argument("--url", required=True, help="the InferenceService's URL (kubectl get isvc)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"the archive's name (default: {DEFAULT_MODEL})")
    args = parser.parse_args()
    print(json.dumps(predict(args.url, args.image, args.model), indent=1))
