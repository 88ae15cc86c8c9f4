"""The peer of `python -m measure bench`'s `litserve` rows: the same artifact and preprocessing behind a minimal
LitServe server, written as a user would write it from LitServe's quick start, not tuned.

    python -m measure.served.peer_litserve EXPORT_DIR PORT
    curl -F content=@examples/cat.jpg http://127.0.0.1:PORT/predict

The export's served artifact (the manifest decides it) in its own runtime with one thread, two workers
(`workers_per_device=2` on the CPU): an ONNX file in ONNX Runtime, an OpenVINO IR in OpenVINO with the precision
hint the export gated it in (bf16 for openvino-bf16, else f32), as OpenVINO's own quick start compiles it; PIL
decoding and torchvision's resize and crop through the same
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
from runtime.images import decode_upright, preprocess
from runtime.openvino import PRECISION_HINTS  # our run precision -> OpenVINO's hint


class ImageClassifierAPI(ls.LitAPI):
    def __init__(self, export_dir: Path):
        super().__init__()
        self.export_dir = export_dir

    def setup(self, device):
        manifest = Manifest.read(self.export_dir)
        self.contract = manifest.input.image_contract()
        record = manifest.served_record()
        path = str(self.export_dir / record.path)
        openvino = record.format == "openvino"
        self.run = self.openvino_model(path, record.run_precision) if openvino else self.onnx_model(path)
        self.labels = json.loads((self.export_dir / manifest.output.labels).read_text())

    @staticmethod
    def onnx_model(path):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        return lambda x: session.run(None, {name: x})[0]

    @staticmethod
    def openvino_model(path, precision):
        import openvino as ov
        config = {"INFERENCE_NUM_THREADS": 1, "PERFORMANCE_HINT": "LATENCY",
                  "INFERENCE_PRECISION_HINT": PRECISION_HINTS[precision]}
        compiled = ov.Core().compile_model(path, "CPU", config)
        request = compiled.create_infer_request()
        return lambda x: request.infer({0: x})[0]

    def decode_request(self, request):
        image = decode_upright(request["content"].file.read())
        return preprocess(image, self.contract).unsqueeze(0).numpy()

    def predict(self, x):
        logits = self.run(x)[0]
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
