"""KV-cache, token and model compression methods: QVG (``qvg``) and the quantization baselines it is
compared with (``kv_baselines``: round-to-nearest, KIVI, QuaRot); ToaSt (``toast``: coupled head-wise
pruning and Token Channel Selection for ViTs, with magnitude / random / token-pruning baselines); PRIM (``prim``:
text-conditioned audio-visual token pruning before and inside the LM of a VLM, reconstructed from the abstract, with
uniform and FastV-style baselines)."""

from algorithms.compression import kv_baselines, prim, qvg, toast

__all__ = ["kv_baselines", "prim", "qvg", "toast"]
