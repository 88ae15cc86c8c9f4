"""Send an image over the Open Inference Protocol (v2 JSON) that Triton and KServe speak.

Triton runs the graph only, so this client does the JPEG -> tensor step itself with the handler's own
function (handlers.core.input_row: the project's decoding and the export's preprocessing contract, read from
manifest.json with contract.records); normalisation is inside the graph.

    python -m examples.clients.v2_client examples/cat.jpg --url http://127.0.0.1:8000 \\
        --manifest artifacts/resnet50/manifest.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import requests

from contract.handler_config import read_labels
from contract.records import MANIFEST_NAME, Manifest
from handlers.core import input_row

DATATYPES = {"float32": "FP32", "float16": "FP16"}


def input_tensor(image: Path, manifest: Manifest) -> np.ndarray:
    """A batch of one: exactly the row the TorchServe handler makes of this image."""
    return input_row(Path(image).read_bytes(), manifest.input.image_contract())[None].numpy()


def v2_request(tensor: np.ndarray, input_name: str, output_name: str) -> dict:
    return {"inputs": [{"name": input_name, "shape": list(tensor.shape), "datatype": DATATYPES[str(tensor.dtype)],
                        "data": tensor.flatten().tolist()}],
            "outputs": [{"name": output_name}]}


def logits_from_v2(response: dict, output_name: str) -> np.ndarray:
    output = next(o for o in response.get("outputs", ()) if o.get("name") == output_name)
    return np.asarray(output.get("data"), dtype=np.float32).reshape(output.get("shape"))


def top_k(logits: np.ndarray, labels: dict[int, str], k: int = 5) -> list[dict]:
    """The handler's answer form; `labels` as contract.records.read_labels gives them."""
    probabilities = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    order = np.argsort(-probabilities)[:k]
    return [{"label": labels.get(int(i), str(i)), "index": int(i), "probability": round(float(probabilities[i]), 6)}
            for i in order]


def predict(url: str, image: Path, manifest: Manifest, labels: dict[int, str], model: str | None = None,
            timeout: float = 30) -> list[dict]:
    """Top-5 from the v2 endpoint; `model` defaults to the exported model's name (its Triton repository name)."""
    body = v2_request(input_tensor(image, manifest), manifest.input.name, manifest.output.name)
    response = requests.post(f"{url}/v2/models/{model or manifest.model.name}/infer", json=body, timeout=timeout)
    response.raise_for_status()
    return top_k(logits_from_v2(response.json(), manifest.output.name)[0], labels)


def export_folder(path: Path) -> Path:
    """--manifest takes manifest.json or the folder that holds it (an export folder or an unpacked archive)."""
    return path.parent if path.name == MANIFEST_NAME else path


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("image", type=Path)
    parser.add_argument("--url", required=True, help="Triton's HTTP endpoint or the InferenceService's URL")
    parser.add_argument("--manifest", type=Path, default=Path("artifacts/resnet50") / MANIFEST_NAME,
                        help="manifest.json of the export (or its folder)")
    parser.add_argument("--model", default=None, help="the model's name on the server (default: the manifest's)")
    args = parser.parse_args()
    folder = export_folder(args.manifest)
    manifest = Manifest.read(folder)
    labels = read_labels(folder / manifest.output.labels) if manifest.output.labels else {}
    if not labels:
        print(f"note: {folder / MANIFEST_NAME} names no labels file; answers carry class indices", file=sys.stderr)
    print(json.dumps(predict(args.url, args.image, manifest, labels, args.model), indent=1))
