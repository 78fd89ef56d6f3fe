"""The Pallas performance core (GPU via Triton, TPU via Mosaic, CPU via the interpreter).

One sub-package per op, each with a pure-jnp reference (from `primitives`), a
kernel body, a public function with `implementation=` and `interpret=`, a
frozen block-size config and a FLOPs/bytes cost model. `_backend` resolves
implementations and builds backend-typed compiler parameters.

Available: `decode_attention` (split-K flash decoding) and `flash_attention`
(prefill, forward kernel, reference-VJP backward). Still to come in issue 3:
kv_quant, ffd_decode, the benchmark script.
"""
