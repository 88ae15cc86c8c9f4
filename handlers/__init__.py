"""How TorchServe runs an exported model: decode -> batch -> predict -> encode."""
