"""The peer of `python -m measure bench`'s `litserve` rows: the same artifact and preprocessing behind a minimal
LitServe server, written as a user would write it from LitServe's quick start, not tuned.

    python -m measure.served.peer_litserve EXPORT_DIR PORT
    curl -F content=@examples/cat.jpg http://127.0.0.1:PORT/predict

The export's served artifact (the manifest decides it) in ONNX Runtime with one intra-op thread, two workers
(`workers_per_device=2` on the CPU), PIL decoding and torchvision's resize and crop through the same
runtime.images functions our handler calls, softmax and top-5. The image comes as a multipart form file
(`request["content"]`): LitServe parses a body as JSON or as a form, so a form upload is how a user sends it
a file. torch keeps its default threads (a user sets none). Measured with litserve 0.2.19.
"""

import json
import sys
from pathlib import Path

import litserve as ls
import numpy as np
import onnxruntime as ort

from contract.records import Manifest
from runtime.images import decode_image, preprocess


class ImageClassifierAPI(ls.LitAPI):
    def __init__(self, export_dir: Path):
        super().__init__()
        self.export_dir = export_dir

    def setup(self, device):
        manifest = Manifest.read(self.export_dir)
        self.contract = manifest.input.image_contract()
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(str(self.export_dir / manifest.served_record().path), options,
                                            providers=["CPUExecutionProvider"])
        self.labels = json.loads((self.export_dir / manifest.output.labels).read_text())

    def decode_request(self, request):
        image = decode_image(request["content"].file.read())
        return preprocess(image, self.contract).unsqueeze(0).numpy()

    def predict(self, x):
        logits = self.session.run(None, {self.session.get_inputs()[0].name: x})[0][0]
        probabilities = np.exp(logits - logits.max())
        return probabilities / probabilities.sum()

    def encode_response(self, probabilities):
        top = np.argsort(probabilities)[::-1][:5]
        return {"predictions": [{"label": self.labels[str(i)], "index": int(i),
                                 "probability": round(float(probabilities[i]), 6)} for i in top]}


if __name__ == "__main__":
    export_dir, port = Path(sys.argv[1]), int(sys.argv[2])
    server = ls.LitServer(ImageClassifierAPI(export_dir), accelerator="cpu", workers_per_device=2)
    server.run(host="127.0.0.1", port=port, generate_client_file=False)
