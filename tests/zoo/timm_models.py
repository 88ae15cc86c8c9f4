"""Two models of the timm library as users create them (random weights: the tests need real architectures,
not trained ones, and stay offline). Both take 32 x 32 images here to keep the tests fast; torch.export needs
the dynamic batch from a batch-2 example for both (as tokens.py).

convnext: ConvNeXt-Atto with a 1500-class head (beyond ImageNet's 1000) and its own labels file.
    Expected forms: all five.
vit: ViT-Tiny/16 (img_size 32: 4 patch tokens and a class token).
    Expected forms: traced, scripted, onnx-traced, onnx-dynamo. Refused: onnx-scripted (the scripted ViT's
    forward has an optional argument left None, which the legacy exporter of a ScriptModule refuses).
"""

import timm


def convnext():
    return timm.create_model("convnext_atto", pretrained=False, num_classes=1500)


def vit():
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32)
