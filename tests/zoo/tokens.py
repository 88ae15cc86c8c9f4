"""A small attention model whose torch.export needs a dynamic batch: it reshapes with the batch (patch tokens,
multi-head attention), so torch.export from a batch-1 example specialises the batch to 1 and refuses it as
dynamic; the pipeline exports it from a batch-2 example (export.forms.exporters.EXPORT_BATCH).

Expected forms: traced, scripted and onnx-dynamo, right at batches 1, 2, 3 and 8. Refused: onnx-traced (in eval
mode nn.MultiheadAttention takes its fused fast path, aten::_native_multi_head_attention, which the legacy ONNX
exporter cannot export) and onnx-scripted (the script keeps the fast path's aten::is_autocast_enabled check,
which it cannot export either).
"""

import torch
from torch import nn


class PatchAttention(nn.Module):
    def __init__(self, classes: int = 4, width: int = 16, patch: int = 8):
        super().__init__()
        self.patches = nn.Conv2d(3, width, patch, stride=patch)
        self.norm = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, 2, batch_first=True)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch = x.shape[0]
        tokens = self.patches(x).reshape(batch, self.patches.out_channels, -1).transpose(1, 2)
        tokens = self.norm(tokens)
        tokens = tokens + self.attention(tokens, tokens, tokens, need_weights=False)[0]
        return self.head(tokens.mean(dim=1))


def factory():
    return PatchAttention()
