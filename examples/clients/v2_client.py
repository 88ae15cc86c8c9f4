"""Send an image over the Open Inference Protocol (v2 JSON) that Triton and KServe speak.

Triton runs the graph only, so this client does the JPEG -> tensor step itself, with the project's own
decoding and the export's preprocessing contract (manifest.json -> input.preprocessing); normalisation is
inside the graph.

    python examples/clients/v2_client.py examples/cat.jpg --url http://127.0.0.1:8000 \\
        --manifest artifacts/resnet50/manifest.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import requests

from runtime.images import ImageContract, decode_image, preprocess

DATATYPES = {"float32": "FP32", "float16": "FP16"}


def input_tensor(image: Path, manifest: dict) -> np.ndarray:
    contract = ImageContract.from_manifest(manifest["input"]["preprocessing"])
    return preprocess(decode_image(Path(image).read_bytes()), contract)[None].numpy()


def v2_request(tensor: np.ndarray, input_name: str, output_name: str) -> dict:
    return {"inputs": [{"name": input_name, "shape": list(tensor.shape), "datatype": DATATYPES[str(tensor.dtype)],
                        "data": tensor.flatten().tolist()}],
            "outputs": [{"name": output_name}]}


def logits_from_v2(response: dict, output_name: str) -> np.ndarray:
    output = next(o for o in response["outputs"] if o["name"] == output_name)
    return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])


def top_k(logits: np.ndarray, labels: dict[str, str], k: int = 5) -> list[dict]:
    probabilities = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    order = np.argsort(-probabilities)[:k]
    return [{"label": labels.get(str(i), str(i)), "index": int(i), "probability": round(float(probabilities[i]), 6)}
            for i in order]


def predict(url: str, image: Path, manifest: dict, labels: dict[str, str], model: str = "resnet",
            timeout: float = 30) -> list[dict]:
    input_name, output_name = manifest["input"]["name"], manifest["output"]["name"]
    body = v2_request(input_tensor(image, manifest), input_name, output_name)
    response = requests.post(f"{url}/v2/models/{model}/infer", json=body, timeout=timeout)
    response.raise_for_status()
    return top_k(logits_from_v2(response.json(), output_name)[0], labels)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("image", type=Path)
    parser.add_argument("--url", required=True, help="Triton's HTTP endpoint or the InferenceService's URL")
    parser.add_argument("--manifest", type=Path, default=Path("artifacts/resnet50/manifest.json"))
    parser.add_argument("--model", default="resnet")
    args = parser.parse_args()
    manifest = json.loads(args.manifest.read_text())
    labels_file = args.manifest.parent / (manifest["output"].get("labels") or "index_to_name.json")
    labels = json.loads(labels_file.read_text()) if labels_file.is_file() else {}
    print(json.dumps(predict(args.url, args.image, manifest, labels, args.model), indent=1))
