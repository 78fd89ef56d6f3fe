"""The Pallas performance core (GPU via Triton, TPU via Mosaic, CPU via the interpreter).

One sub-package per op, each with a pure-jnp reference (from `primitives`), a
kernel body, a public function with `implementation=` and `interpret=`, a
frozen block-size config and a FLOPs/bytes cost model. `_backend` resolves
implementations and builds backend-typed compiler parameters.

Available: `flash_attention` (prefill; forward and backward (dq, dk/dv) Pallas kernels),
`decode_attention` (split-K flash decoding), `kv_quant` (group-wise 2/4/8-bit
quantize / dequantize and decode attention over packed K/V) and `ffd_decode`
(Faster Flash Decoding: fused 2-bit scan, top-delta page selection, attention),
`grouped_matmul` (MoE experts), `qvg` (k-means assignment, attention over QVG spans) and
`vegas` (verification attention with score rows, sparse decode over an index list).
`python -m pallas_kernels.bench` prints modeled FLOPs and bytes, measured XLA wall
time and projected accelerator time per op.
"""
