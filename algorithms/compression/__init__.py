"""KV-cache, token and model compression methods: QVG (``qvg``) and the quantization baselines it is
compared with (``kv_baselines``: round-to-nearest, KIVI, QuaRot); ToaSt (``toast``: coupled head-wise
pruning and Token Channel Selection for ViTs, with magnitude / random / token-pruning baselines)."""

from algorithms.compression import kv_baselines, qvg, toast

__all__ = ["kv_baselines", "qvg", "toast"]
