"""KV-cache and token compression methods: QVG (``qvg``) and the quantization baselines it is
compared with (``kv_baselines``: round-to-nearest, KIVI, QuaRot)."""

from algorithms.compression import kv_baselines, qvg

__all__ = ["kv_baselines", "qvg"]
