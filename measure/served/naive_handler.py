"""The naive baseline for `python -m measure bench`: a handler written the way TorchServe's documentation
teaches a custom image classifier, serving the traced TorchScript. It is a yardstick, not our code path:
only the benchmark packages it (with torch-model-archiver, `--handler measure/served/naive_handler.py`).

As the docs' examples do: subclass BaseHandler (its initialize() runs torch.jit.load of the serialized
file and reads index_to_name.json), decode each request with PIL, preprocess with a torchvision
transforms.Compose, stack, run the model, softmax + top-5 in postprocess. Nothing is tuned: TorchServe's
default worker count, torch's default intra-op threads in every worker, no batching. The one change from
the docs' ImageClassifier is that it does not Normalize: the exported graph normalises inside, and doing it
twice would serve wrong answers (a baseline must be correct to be a fair one).
"""

import base64
import io

import torch
import torch.nn.functional as F
from PIL import Image
from torchvision import transforms
from ts.torch_handler.base_handler import BaseHandler
from ts.utils.util import map_class_to_label


class NaiveImageClassifier(BaseHandler):
    topk = 5
    image_processing = transforms.Compose([
        transforms.Resize(256),
        transforms.CenterCrop(224),
        transforms.ToTensor(),
    ])

    def preprocess(self, data):
        images = []
        for row in data:
            image = row.get("data") or row.get("body")
            if isinstance(image, str):
                image = base64.b64decode(image)
            image = Image.open(io.BytesIO(image)).convert("RGB")
            images.append(self.image_processing(image))
        return torch.stack(images).to(self.device)

    def postprocess(self, data):
        probabilities = F.softmax(data, dim=1)
        probs, classes = torch.topk(probabilities, self.topk, dim=1)
        return map_class_to_label(probs.tolist(), self.mapping, classes.tolist())
