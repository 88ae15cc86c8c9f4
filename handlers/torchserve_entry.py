"""TorchServe's handler file (the archive's --handler): a module-level `handle` over TorchServeHandler.

TorchServe imports this file from the unpacked archive, where handlers/, runtime/, contract/errors.py and contract/records.py sit beside it.
"""

from handlers.image_classifier import TorchServeHandler

_service = TorchServeHandler()


def handle(data, context):
    if not _service.initialized:
        _service.initialize(context)
    if data is None:  # TorchServe's warm-up call during model load
        return None
    return _service.handle(data, context)
