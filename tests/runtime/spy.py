"""A recording ONNX Runtime backend: registered in place of the real one to prove who runs artifacts."""

from runtime.onnxruntime import OnnxRuntimeBackend

OPENED: list = []  # (name, path) per opened backend
PREDICTED: list = []  # name per predict call


class SpyOnnxBackend(OnnxRuntimeBackend):
    def __init__(self, path, options, name=None):
        super().__init__(path, options, name)
        OPENED.append((self.name, self.path.name))

    def predict(self, batch):
        PREDICTED.append(self.name)
        return super().predict(batch)
