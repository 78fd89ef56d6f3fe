"""A decoder-only Transformer LM in Flax NNX, built to be looked inside.

Dimension legend: `b` batch, `t` tokens, `D` model width, `h` query heads,
`k` key/value heads, `d` head dim, `f` FFN width, `v` vocabulary, `L` layers.

Architecture (LLaMA/Gemma family): token embedding, L pre-norm blocks
(RMSNorm -> GQA attention with RoPE -> residual; RMSNorm -> FFN -> residual),
final RMSNorm, output projection (optionally tied to the embedding).

What the papers need from a model, all passed as arguments (no monkey-patching):

  * `head_mask` [L, h] or [L, b, h]: multiplies each head's output before the
    output projection (head pruning, head ablations);
  * `head_deltas` [L, h, d] or [L, b, h, d]: added to each head's output
    (head-level steering);
  * `residual_deltas` [L, D], [L, b, D] or [L, b, t, D]: added to the residual
    stream after block l (activation steering);
  * `router_biases` [L, E] or [L, b, E]: added to the router logits of a
    mixture-of-experts FFN (`ffn_type="moe"`, see `models.moe`) before gating
    (test-time rerouting); dense FFNs ignore them;
  * `input_embeddings` [b, t, D]: replaces the token-embedding lookup (a vision-language
    model's interleaved image/audio/text embeddings, see `models.vlm`);
  * `attention_bias(layer, q, k) -> [b, h, t, s]`: additive attention logits computed from
    each layer's rotated queries and keys (Hyper-ICL's low-rank calibration, ALiBi);
  * `return_intermediates=True`: the residual stream after the embedding and
    after every block [L+1, b, t, D], the per-head attention outputs
    [L, b, t, h, d] (after mask and delta), and each FFN's auxiliary outputs
    (e.g. router logits of a mixture-of-experts FFN);
  * self-speculative decoding (Vegas), with a KV cache: `score_rows=(r, ...)`
    routes the attention of a multi-token append through
    `pallas_kernels.vegas.verify_attention` and returns per layer the raw scores
    of those query rows over the cache [L, b, h, R, S] and every row's
    logsumexp [L, b, h, t] (intermediates `attn_scores`, `attn_lse`);
    `sparse_decode=SparseDecode(select, recent_start, max_recent)` makes a
    one-token step attend only to the keys `select(layer, q, keys)` lists plus
    the recent range, through `pallas_kernels.vegas.sparse_decode_attention`;
  * FFD decoding (`AttentionConfig(decode="ffd")`): the cache carries each
    layer's full pages quantized (`KVCache.pages`, kept current as appends
    complete pages), and every one-token decode step returns the fraction of
    cache pages each layer kept [L] (intermediates `ffd_kept_fraction`, over
    sequences and KV heads).

The FFN is a pluggable slot: `TransformerConfig.ffn_type` names a factory in
`FFN_TYPES` (`register_ffn` adds one). An FFN module maps [b, t, D] to
`(y [b, t, D], aux: dict)`.

KV cache: pass a `KVCache` (see `models.kv_cache`) to append `t` tokens per
sequence at positions `cache.lengths + arange(t)`; the same call serves
prefill, one-token decode and multi-token append. The cache's axis order
(`TransformerConfig.attention.kv_layout`, token-major "bskd" or head-major "bksd") is
chosen per backend by measurement and read as stored by every decode path. Every parameter carries
logical axis names (`out_sharding` metadata) that `algorithms.training` maps to
a device mesh.

References:
  Touvron et al., "LLaMA: Open and Efficient Foundation Language Models", arXiv:2302.13971, 2023.
  Shazeer, "GLU Variants Improve Transformer", arXiv:2002.05202, 2020.
  Zhang & Sennrich, "Root Mean Square Layer Normalization", arXiv:1910.07467, 2019.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from models.kv_cache import KVCache, default_kv_layout, init_cache, token_major, write_tokens
from pallas_kernels import decode_attention as decode_kernel
from pallas_kernels import _backend as kernel_backend
from pallas_kernels import ffd_decode as ffd_kernel
from pallas_kernels import flash_attention as flash_kernel
from pallas_kernels import grouped_matmul as gmm_kernel
from pallas_kernels import vegas as vegas_kernel
from primitives import attention as attn_lib
from primitives import ffd as ffd_lib
from primitives.validation import check_finite, check_int, check_token_ids

DECODE_ATTENTION = ("dense", "kernel", "ffd")
FFD_SELECTORS = ("top_delta", "top_k", "quest")
FFD_RESIDUAL_DTYPES = ("float32", "bfloat16", "float8_e4m3fn")

__all__ = [
    "TransformerConfig",
    "AttentionConfig",
    "FFDConfig",
    "MoEConfig",
    "Transformer",
    "TransformerOutput",
    "SparseDecode",
    "RMSNorm",
    "Attention",
    "GatedFFN",
    "Block",
    "FFN_TYPES",
    "register_ffn",
    "DEFAULT_LOGICAL_AXIS_RULES",
]

# Logical parameter axes -> mesh axes ("data", "fsdp", "tensor"). None = replicated.
DEFAULT_LOGICAL_AXIS_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("norm", None),
    ("layers", None),  # the stacked layer axis of a `scan_layers` model
)

# `TransformerConfig.remat`: what a block keeps for the backward pass (jax.checkpoint policies).
# "none" keeps every intermediate; "full" keeps only each block's input and recomputes the block;
# "dots" keeps the matmul outputs and recomputes the element-wise work (norms, activations, softmax).
REMAT_POLICIES: dict[str, Callable[..., bool] | None] = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
REMAT = ("none", *REMAT_POLICIES)
PREFILL_ATTENTION = ("auto", "dense", "flash")


# Fields that are sizes (TypeError unless int; head_dim may be None) and float hyper-parameters (ValueError
# unless finite). The attention and MoE sections check their own fields.
_INT_FIELDS = ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "d_ff", "head_dim")
_FLOAT_FIELDS = ("rope_base", "norm_eps", "init_std")


def _repr_hiding_defaults(self) -> str:
    """The dataclass repr, except that a ``repr=False`` field shows only when not at its default (so
    adding such a field leaves the repr of existing configs, and the fingerprints built from it, alone)."""
    shown = [f for f in dataclasses.fields(self) if f.repr or getattr(self, f.name) != f.default]
    return f"{type(self).__name__}(" + ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in shown) + ")"


@dataclasses.dataclass(frozen=True, kw_only=True)
class FFDConfig:
    """Faster Flash Decoding settings of the "ffd" decode mode (`TransformerConfig.attention.ffd`).

    Validated on construction (TypeError / ValueError naming the field, e.g. "attention.ffd.delta").

    Attributes:
      delta: FFD's threshold margin in log2 units (inf keeps every page; NaN rejected).
      page_size: page size in tokens (128, the paper's code's default; on TPU a page's packed 2-bit codes
        are then one whole 32 x 128 uint8 tile, where pages of 64 make XLA store the codes in another
        layout and copy them for the kernel at every step).
      bits: key code width (2 or 4).
      selector: the page selector: "top_delta" (FFD, through the kernel dispatcher), or the baselines
        "top_k" (best pages by 2-bit scan maximum) and "quest" (best pages by per-page min/max key
        bounds), which keep ``ceil(kept_fraction * full pages)`` pages per sequence and KV head.
      kept_fraction: the budget selectors' kept fraction, in (0, 1].
      gather_fraction: "top_delta" on the XLA (CPU) path, over a cache with FFD pages
        (`KVCache.pages`): the static page budget of `primitives.ffd.fast_ffd_decode`, as a fraction
        of each sequence's page slots over all KV heads, in (0, 1]. A step whose int8 scan leaves
        more candidate pages runs the exact scan of every page instead: the same result, slower.
        Not shown in the repr at its default.
      residual_dtype: storage of the pages' residual ``K - Khat`` that refines kept pages' scores:
        "float32" (the default: exact, so keeping every page gives dense attention to rounding),
        "bfloat16" or "float8_e4m3fn" (the paper's code: a quarter of float32's bytes, the
        refinement rounded). The CPU fast path attends from the exact keys only with float32;
        otherwise it refines from the stored residual, as the kernel does. Not shown in the repr
        at its default.
    """

    delta: float = 5.0
    page_size: int = 128
    bits: int = 2
    selector: str = "top_delta"
    kept_fraction: float = 0.1
    gather_fraction: float = dataclasses.field(default=0.25, repr=False)
    residual_dtype: str = dataclasses.field(default="float32", repr=False)

    __repr__ = _repr_hiding_defaults

    def __post_init__(self):
        p = "attention.ffd."
        for name in ("page_size", "bits"):
            check_int(p + name, getattr(self, name))
        check_finite(p + "kept_fraction", self.kept_fraction)
        check_finite(p + "gather_fraction", self.gather_fraction)
        if math.isnan(self.delta):
            raise ValueError(f"{p}delta must not be NaN (inf keeps every page); got {self.delta}")
        if self.selector not in FFD_SELECTORS:
            raise ValueError(f"{p}selector must be one of {FFD_SELECTORS}; got {self.selector!r}")
        if self.residual_dtype not in FFD_RESIDUAL_DTYPES:
            raise ValueError(f"{p}residual_dtype must be one of {FFD_RESIDUAL_DTYPES}; got {self.residual_dtype!r}")
        for name in ("kept_fraction", "gather_fraction"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{p}{name} must be in (0, 1]; got {getattr(self, name)}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AttentionConfig:
    """How the decoder's attention reads its KV cache (`TransformerConfig.attention`).

    Attributes:
      decode: how one-token decode steps over the KV cache attend: "dense" (the reference
        attention, the default), "kernel" (the split-K `pallas_kernels.decode_attention`
        dispatcher) or "ffd" (Faster Flash Decoding through `pallas_kernels.ffd_decode` with the
        settings in `ffd`: `init_cache` adds FFD page slots to the cache, each page's keys are
        quantized once, by the call that completes it, and on CPU the step runs the int8-scan fast
        path; a cache without page slots is quantized whole at every step: the same result, slower).
      prefill: how attention over whole sequences without a KV cache (training, scoring) runs:
        "dense" (the reference, materialises the [b, h, t, t] scores), "flash"
        (`pallas_kernels.flash_attention`, Pallas forward and backward: memory linear in t) or
        "auto" (the default: flash when compiling for TPU, where the kernel is compile-checked at
        production shapes, and the call is one flash can mask; dense otherwise, so CPU results do not
        change; GPU stays dense until the Triton kernel is measured on a GPU). Flash masks causally
        by token index: "flash" with explicit positions, segment_ids or an attention_bias raises
        ValueError. Not shown in the repr at its default.
      kv_layout: axis order of the KV cache `init_cache` creates: "bskd" ([b, S, k, d]) or "bksd"
        ([b, k, S, d]); None = `models.kv_cache.default_kv_layout()`, the order measured fastest on
        the default backend ("bksd" on CPU). Every path reads the cache in the order it was
        created in, so this changes speed, not results.
      ffd: the "ffd" mode's settings (`FFDConfig`).
    """

    decode: str = "dense"
    kv_layout: str | None = None
    ffd: FFDConfig = FFDConfig()
    prefill: str = dataclasses.field(default="auto", repr=False)

    __repr__ = _repr_hiding_defaults

    def __post_init__(self):
        if self.decode not in DECODE_ATTENTION:
            raise ValueError(f"attention.decode must be one of {DECODE_ATTENTION}; got {self.decode!r}")
        if self.prefill not in PREFILL_ATTENTION:
            raise ValueError(f"attention.prefill must be one of {PREFILL_ATTENTION}; got {self.prefill!r}")
        if self.kv_layout is not None and self.kv_layout not in attn_lib.KV_LAYOUTS:
            raise ValueError(f"attention.kv_layout must be None or one of {attn_lib.KV_LAYOUTS}; "
                             f"got {self.kv_layout!r}")
        if not isinstance(self.ffd, FFDConfig):
            raise TypeError(f"attention.ffd must be of type FFDConfig; got {type(self.ffd).__name__}")

    @property
    def resolved_kv_layout(self) -> str:
        return default_kv_layout() if self.kv_layout is None else self.kv_layout


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoEConfig:
    """The mixture-of-experts FFN of ``ffn_type="moe"`` (`TransformerConfig.moe`, see `models.moe`).

    Types are checked on construction; ranges (`check`) only when the config's FFN is an MoE, so a
    dense model ignores this section.

    Attributes:
      num_experts: routed experts E.
      experts_per_token: top-k experts per token.
      num_shared_experts: always-on experts added to the routed output.
      d_ff: hidden width of each expert (None = `TransformerConfig.d_ff`).
      router_renormalize: renormalize the top-k softmax probabilities to sum to 1 (else the raw
        softmax-over-all-experts probabilities are the gates).
      load_balance_weight: weight of the Switch/GShard load-balancing loss per layer.
      router_z_weight: weight of the router z-loss per layer.
      implementation: `pallas_kernels.grouped_matmul` implementation (None = best available: the
        Pallas kernel on TPU/GPU, the XLA reference on CPU).
    """

    num_experts: int = 8
    experts_per_token: int = 2
    num_shared_experts: int = 0
    d_ff: int | None = None
    router_renormalize: bool = True
    load_balance_weight: float = 0.01
    router_z_weight: float = 0.001
    implementation: str | None = None

    def __post_init__(self):
        for name in ("num_experts", "experts_per_token", "num_shared_experts", "d_ff"):
            if getattr(self, name) is not None:
                check_int(f"moe.{name}", getattr(self, name))
        for name in ("load_balance_weight", "router_z_weight"):
            check_finite(f"moe.{name}", getattr(self, name))

    def check(self) -> None:
        """Raises ValueError naming the field (e.g. "moe.experts_per_token") unless the ranges hold."""
        if self.num_experts < 1:
            raise ValueError(f"moe.num_experts must be >= 1 for ffn_type='moe'; got {self.num_experts}")
        if not 1 <= self.experts_per_token <= self.num_experts:
            raise ValueError(f"moe.experts_per_token must be in [1, moe.num_experts={self.num_experts}]; "
                             f"got {self.experts_per_token}")
        if self.num_shared_experts < 0:
            raise ValueError(f"moe.num_shared_experts must be >= 0; got {self.num_shared_experts}")
        if self.d_ff is not None and self.d_ff < 1:
            raise ValueError(f"moe.d_ff must be >= 1 or None; got {self.d_ff}")
        for name in ("load_balance_weight", "router_z_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"moe.{name} must be >= 0; got {getattr(self, name)}")
        if self.implementation is not None and self.implementation not in gmm_kernel.IMPLEMENTATIONS:
            raise ValueError(f"moe.implementation must be None or one of {gmm_kernel.IMPLEMENTATIONS}; "
                             f"got {self.implementation!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransformerConfig:
    """Shape and options of the decoder LM.

    Validated on construction: sizes must be ints (TypeError naming the field, e.g. for
    `vocab_size=32.5`), float hyper-parameters finite, and ranges as below (ValueError). The
    attention and MoE sections are nested frozen dataclasses that check their own fields
    (messages name the path, e.g. "attention.ffd.delta"); change one with
    ``dataclasses.replace(cfg, attention=dataclasses.replace(cfg.attention, decode="ffd"))``.

    Attributes:
      vocab_size: number of token ids.
      d_model: residual stream width D.
      num_layers: number of blocks L.
      num_heads: query heads h.
      num_kv_heads: key/value heads k (h % k == 0; 1 = MQA, h = MHA).
      d_ff: FFN hidden width f.
      head_dim: per-head width d; defaults to d_model // num_heads.
      rope_base: RoPE frequency base.
      norm_eps: RMSNorm epsilon.
      tie_embeddings: output projection = embedding transposed.
      ffn_type: key into FFN_TYPES ("gated" = SwiGLU/GeGLU, "moe" = `models.moe.MoEFFN`).
      ffn_activation: "silu" or "gelu" for the gated FFN (and the MoE experts).
      dtype: compute dtype ("float32" or "bfloat16"); parameters stay float32.
      init_std: std of the embedding init; other weights use 1/sqrt(fan_in).
      attention: KV-cache order and decode attention (`AttentionConfig`, with its `FFDConfig`).
      moe: the MoE FFN's settings when ``ffn_type="moe"`` (`MoEConfig`).
      scan_layers: hold the L blocks as one block with stacked parameters (a leading "layers" axis)
        and run them with `nnx.scan`: the step compiles once per block instead of L times (a 16-layer
        1B model compiles in seconds, not minutes). The parameter tree differs from the unrolled
        one (checkpoints do not transfer), and the forward pass takes no KV cache and none of the
        per-layer hooks (ValueError naming the argument): a training and scoring layout.
      remat: rematerialisation of each block in the backward pass, one of `REMAT`: "none",
        "full" (keep the block's input only) or "dots" (keep matmul outputs).

    `scan_layers`, `remat` and `attention.prefill` change memory and compile time, not results, and
    are left out of the repr at their defaults (repr-based checkpoint fingerprints stay valid).
    """

    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    d_ff: int
    head_dim: int | None = None
    rope_base: float = 10000.0
    norm_eps: float = 1e-6
    tie_embeddings: bool = False
    ffn_type: str = "gated"
    ffn_activation: str = "silu"
    dtype: str = "float32"
    init_std: float = 0.02
    attention: AttentionConfig = AttentionConfig()
    moe: MoEConfig = MoEConfig()
    scan_layers: bool = dataclasses.field(default=False, repr=False)
    remat: str = dataclasses.field(default="none", repr=False)

    __repr__ = _repr_hiding_defaults

    def __post_init__(self):
        for name in _INT_FIELDS:
            if getattr(self, name) is not None:
                check_int(f"TransformerConfig.{name}", getattr(self, name))
        for name in _FLOAT_FIELDS:
            check_finite(f"TransformerConfig.{name}", getattr(self, name))
        for name in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "d_ff"):
            if getattr(self, name) < 1:
                raise ValueError(f"TransformerConfig.{name} must be >= 1; got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim is None and self.d_model % self.num_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads}) "
                "unless head_dim is given"
            )
        if self.resolved_head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE; got {self.resolved_head_dim}")
        if self.ffn_activation not in _ACTIVATIONS:
            raise ValueError(f"ffn_activation must be one of {sorted(_ACTIVATIONS)}; got {self.ffn_activation!r}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16; got {self.dtype!r}")
        for name, cls in (("attention", AttentionConfig), ("moe", MoEConfig)):
            if not isinstance(getattr(self, name), cls):
                raise TypeError(f"TransformerConfig.{name} must be of type {cls.__name__}; "
                                f"got {type(getattr(self, name)).__name__}")
        if self.ffn_type == "moe":
            self.moe.check()
        if not isinstance(self.scan_layers, bool):
            raise TypeError(f"TransformerConfig.scan_layers must be a bool; got {self.scan_layers!r}")
        if self.remat not in REMAT:
            raise ValueError(f"TransformerConfig.remat must be one of {REMAT}; got {self.remat!r}")

    @property
    def resolved_kv_layout(self) -> str:
        return self.attention.resolved_kv_layout

    @property
    def resolved_moe_d_ff(self) -> int:
        return self.d_ff if self.moe.d_ff is None else self.moe.d_ff

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.num_heads

    def _ffn_weights(self, *, active: bool) -> int:
        """FFN weights per layer: all of them, or those one token multiplies (MoE: k + shared + router)."""
        if self.ffn_type != "moe":
            return 3 * self.d_model * self.d_ff
        moe = self.moe
        experts = (moe.experts_per_token if active else moe.num_experts) + moe.num_shared_experts
        return 3 * self.d_model * self.resolved_moe_d_ff * experts + self.d_model * moe.num_experts

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)

    def num_params(self) -> int:
        """Parameter count (embedding included once when tied)."""
        D, d, h, k, f, v = (self.d_model, self.resolved_head_dim, self.num_heads,
                            self.num_kv_heads, self.d_ff, self.vocab_size)
        per_layer = D * d * (2 * h + 2 * k) + self._ffn_weights(active=False) + 2 * D
        return v * D * (1 if self.tie_embeddings else 2) + self.num_layers * per_layer + D

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward = 3x forward).

        Forward: 2 FLOPs per multiply-add of every weight matmul (embedding
        lookup excluded, output projection included) plus the attention score and
        value matmuls, 2 * 2 * t * h * d per layer for a full causal-free count
        (PaLM appendix B convention, counting the full t x t score matrix).
        """
        D, d, h, k, f, v = (self.d_model, self.resolved_head_dim, self.num_heads,
                            self.num_kv_heads, self.d_ff, self.vocab_size)
        matmul = self.num_layers * (D * d * (2 * h + 2 * k) + self._ffn_weights(active=True)) + D * v
        attn = self.num_layers * 2 * seq_len * h * d
        return 3 * 2 * (matmul + attn)


_ACTIVATIONS = {"silu": jax.nn.silu, "gelu": jax.nn.gelu}


def _param(rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple[str | None, ...], std: float) -> nnx.Param:
    """A float32 normal(0, std) parameter with logical axis names (sharded later, not eagerly)."""
    value = std * jax.random.normal(rngs.params(), shape, jnp.float32)
    return nnx.Param(value, out_sharding=axes, eager_sharding=False)


class RMSNorm(nnx.Module):
    """y = x / rms(x) * scale, computed in float32."""

    def __init__(self, dim: int, *, eps: float = 1e-6):
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32), out_sharding=("norm",), eager_sharding=False)
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return (y * self.scale[...]).astype(x.dtype)


class GatedFFN(nnx.Module):
    """Gated FFN: down(act(x @ W_gate) * (x @ W_up)). Returns (y, {})."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        D, f = config.d_model, config.d_ff
        self.w_gate = _param(rngs, (D, f), ("embed", "mlp"), 1 / math.sqrt(D))
        self.w_up = _param(rngs, (D, f), ("embed", "mlp"), 1 / math.sqrt(D))
        self.w_down = _param(rngs, (f, D), ("mlp", "embed"), 1 / math.sqrt(f))
        self.activation = config.ffn_activation
        self.dtype = config.compute_dtype

    def __call__(self, x: jax.Array, *, router_bias: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
        del router_bias  # dense: there is no router
        act = _ACTIVATIONS[self.activation]
        wg, wu, wd = (w[...].astype(self.dtype) for w in (self.w_gate, self.w_up, self.w_down))
        hidden = act(x @ wg) * (x @ wu)
        return hidden @ wd, {}


FFN_TYPES: dict[str, Callable[..., nnx.Module]] = {"gated": GatedFFN}


def register_ffn(name: str, factory: Callable[..., nnx.Module]) -> None:
    """Registers an FFN factory `factory(config, *, rngs) -> Module` under `name`.

    The module must map [b, t, D] to `(y [b, t, D], aux dict)`; it is called with
    a keyword `router_bias=` only when the caller passes router biases. `aux` entries
    are returned per layer in the intermediates (and `aux["loss"]`, if present,
    is summed into `TransformerOutput.aux_loss`).
    """
    FFN_TYPES[name] = factory


class SparseDecode(NamedTuple):
    """How a one-token decode step attends when drafting with sparse attention.

    Attributes:
      select: `(layer, q [b, h, d], keys [b, S, kh, d]) -> (indices [b, K] int32, valid [b, K] bool)`,
        the listed keys of that layer (a drafter: precomputed Vegas / StreamingLLM sets ignore q;
        Quest scores pages with it). Indices must be unique and below `recent_start`.
      recent_start: [b] first key of the recent range; the step also attends to every key in
        [recent_start, cache length including this token).
      max_recent: static bound on the recent range's length.
    """

    select: Callable[[int, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]
    recent_start: jax.Array
    max_recent: int


class Attention(nnx.Module):
    """GQA self-attention with RoPE, per-head masks/deltas and an optional KV cache."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        D, h, k, d = config.d_model, config.num_heads, config.num_kv_heads, config.resolved_head_dim
        std = 1 / math.sqrt(D)
        self.wq = _param(rngs, (D, h, d), ("embed", "heads", "head_dim"), std)
        self.wk = _param(rngs, (D, k, d), ("embed", "kv_heads", "head_dim"), std)
        self.wv = _param(rngs, (D, k, d), ("embed", "kv_heads", "head_dim"), std)
        self.wo = _param(rngs, (h, d, D), ("heads", "head_dim", "embed"), 1 / math.sqrt(h * d))
        self.rope_base = config.rope_base
        self.dtype = config.compute_dtype
        self.decode_mode = config.attention.decode
        self.prefill_mode = config.attention.prefill
        self.ffd = config.attention.ffd

    def __call__(
        self,
        x: jax.Array,
        positions: jax.Array,
        *,
        segment_ids: jax.Array | None = None,
        layer_cache: tuple[jax.Array, jax.Array, ffd_lib.FFDPages | None] | None = None,
        cache_lengths: jax.Array | None = None,
        new_lengths: jax.Array | None = None,
        kv_layout: str = "bskd",
        head_mask: jax.Array | None = None,
        head_delta: jax.Array | None = None,
        score_rows: tuple[int, ...] | None = None,
        sparse_decode: tuple[Callable, jax.Array, int] | None = None,
        bias_fn: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
        default_positions: bool = False,
    ) -> tuple[jax.Array, jax.Array, tuple[jax.Array, jax.Array] | None, dict[str, jax.Array]]:
        """Returns (output [b, t, D], head outputs [b, t, h, d], updated (k, v, pages) cache or None, extras).

        `layer_cache` is (keys, values, FFD pages or None) before this call's tokens; `cache_lengths`
        and `new_lengths` [b] are the valid tokens before and after it (the pages are quantized as
        the append completes them).

        `extras` holds `scores` [b, h, R, S] and `lse` [b, h, t] when `score_rows` is given (with a
        cache) and `ffd_kept_fraction` (a scalar) on an FFD decode step; `sparse_decode` is (select
        bound to this layer, recent_start, max_recent);
        `kv_layout` is the axis order of `layer_cache` (read as stored, never transposed);
        `bias_fn(q [b, t, h, d], k [b, s, k, d]) -> [b, h, t, s]` adds attention logits (dense paths);
        `default_positions` says `positions` are 0..t-1 (the flash prefill masks by token index).
        """
        wq, wk, wv, wo = (w[...].astype(self.dtype) for w in (self.wq, self.wk, self.wv, self.wo))
        q = attn_lib.rope(jnp.einsum("btD,Dhd->bthd", x, wq), positions, base=self.rope_base)
        k = attn_lib.rope(jnp.einsum("btD,Dkd->btkd", x, wk), positions, base=self.rope_base)
        v = jnp.einsum("btD,Dkd->btkd", x, wv)
        new_cache, extras = None, {}
        if layer_cache is None and self._flash_prefill(segment_ids, bias_fn, default_positions):
            heads = _flash_prefill(q, k, v)
        elif layer_cache is None:
            heads = attn_lib.attention(
                q, k, v, causal=True, q_positions=positions, kv_positions=positions,
                q_segment_ids=segment_ids, kv_segment_ids=segment_ids,
                bias=None if bias_fn is None else bias_fn(q, k),
            )
        else:
            k_all = write_tokens(layer_cache[0], k, cache_lengths, layout=kv_layout)
            v_all = write_tokens(layer_cache[1], v, cache_lengths, layout=kv_layout)
            pages = layer_cache[2]
            if pages is not None:
                pages = ffd_lib.update_pages(pages, k_all, cache_lengths, new_lengths, max_new_tokens=x.shape[1],
                                             layout=kv_layout)
            new_cache = (k_all, v_all, pages)
            k_all, v_all = k_all.astype(self.dtype), v_all.astype(self.dtype)
            if score_rows is not None:
                res = vegas_kernel.verify_attention(q, k_all, v_all, positions, rows=tuple(score_rows),
                                                    kv_layout=kv_layout)
                heads, extras = res.out, {"scores": res.scores, "lse": res.lse}
            elif sparse_decode is not None:
                select, recent_start, max_recent = sparse_decode
                # Drafters see the keys token-major (a view: the built-in ones read only its shape).
                indices, valid = select(q[:, 0], token_major(k_all, kv_layout))
                heads = vegas_kernel.sparse_decode_attention(
                    q[:, 0], k_all, v_all, indices, valid, recent_start, cache_lengths + 1,
                    max_recent=max_recent, kv_layout=kv_layout)[:, None]
            elif x.shape[1] == 1 and self.decode_mode != "dense" and bias_fn is None:
                heads, kept = self._decode_step(q[:, 0], k_all, v_all, cache_lengths + 1, kv_layout, pages)
                heads = heads[:, None]
                if kept is not None:
                    extras = {"ffd_kept_fraction": kept}
            else:
                # Entries past the valid length lie after every valid query's position,
                # so the causal mask alone hides them.
                bias = None if bias_fn is None else bias_fn(q, token_major(k_all, kv_layout))
                heads = attn_lib.attention(q, k_all, v_all, causal=True, q_positions=positions,
                                           kv_layout=kv_layout, bias=bias)
        if head_mask is not None:
            heads = heads * _per_head(head_mask).astype(heads.dtype)
        if head_delta is not None:
            heads = heads + _per_head_vector(head_delta).astype(heads.dtype)
        return jnp.einsum("bthd,hdD->btD", heads, wo), heads, new_cache, extras

    def _flash_prefill(self, segment_ids, bias_fn, default_positions: bool) -> bool:
        """Whether a no-cache pass runs `flash_attention` (see `AttentionConfig.prefill`)."""
        maskable = segment_ids is None and bias_fn is None and default_positions
        if self.prefill_mode == "flash" and not maskable:
            raise ValueError("attention.prefill='flash' masks causally by token index: it needs the default positions "
                             "0..t-1 and no segment_ids or attention_bias; use attention.prefill='dense' or 'auto'")
        if self.prefill_mode == "auto":
            return maskable and kernel_backend.target_backend() == "tpu"
        return self.prefill_mode == "flash"

    def _decode_step(self, q: jax.Array, k: jax.Array, v: jax.Array, lengths: jax.Array,
                     kv_layout: str, pages: ffd_lib.FFDPages | None) -> tuple[jax.Array, jax.Array | None]:
        """One query per sequence over its cache, through the configured kernel dispatcher.

        FFD reads the quantized pages the cache carries (`pages`), or, for a cache without them,
        quantizes every page of the dense cache in this step. Its top-delta selection runs
        `primitives.ffd.fast_ffd_decode` on the XLA (CPU) path when the pages hold int8 scan keys,
        else the `pallas_kernels.ffd_decode` dispatcher; both give FFD's result.

        Returns the heads [b, h, d] and, for FFD decoding, the step's kept page fraction (a scalar
        over sequences and KV heads; None for the dense kernel).
        """
        if self.decode_mode == "kernel":
            return decode_kernel.decode_attention(q, k, v, lengths, kv_layout=kv_layout), None
        ffd = self.ffd
        if pages is None:
            cache = ffd_lib.build_cache(k, v, lengths, page_size=ffd.page_size, bits=ffd.bits, layout=kv_layout,
                                        residual_dtype=jnp.dtype(ffd.residual_dtype),
                                        scan_keys=False)  # the int8 scan keys serve only fast_ffd_decode
        else:
            have = (pages.page_size, pages.bits, str(pages.residual.dtype))
            if have != (ffd.page_size, ffd.bits, ffd.residual_dtype):
                raise ValueError(f"the cache's FFD pages have page size {have[0]}, {have[1]} bits and a {have[2]} "
                                 f"residual; attention.ffd has page_size={ffd.page_size}, bits={ffd.bits}, "
                                 f"residual_dtype={ffd.residual_dtype} (build the cache with model.init_cache)")
            cache = ffd_lib.paged_cache(pages, k, v, lengths, layout=kv_layout)
        if ffd.selector == "top_delta" and cache.scan_keys is not None and kernel_backend.resolve_implementation(None) == "xla":
            slots = cache.scales.shape[1] * cache.num_pages
            # Exact keys stand in for Khat + R only with a float32 residual; a rounded one refines as the kernel.
            keys = ffd_lib.head_major_pages(k, ffd.page_size, kv_layout) if cache.residual.dtype == jnp.float32 else None
            fast = ffd_lib.fast_ffd_decode(q, cache, delta=float(ffd.delta),
                                           capacity=max(1, math.ceil(ffd.gather_fraction * slots)),
                                           keys=keys, fallback_capacity=max(1, cache.num_pages))
            return fast.out, ffd_lib.kept_fraction(fast.keep, cache)
        if ffd.selector == "top_delta":
            out = ffd_kernel.ffd_decode(q, cache, delta=float(ffd.delta))
        else:
            budget = jnp.ceil(ffd.kept_fraction * cache.full_pages).astype(jnp.int32)
            select = ffd_lib.top_k_keep if ffd.selector == "top_k" else ffd_lib.quest_keep
            out = ffd_lib.sparse_decode(q, cache, select(q, cache, budget))
        return out.out, ffd_lib.kept_fraction(out.keep, cache)


def _per_head(mask: jax.Array) -> jax.Array:
    """[h] -> [1, 1, h, 1]; [b, h] -> [b, 1, h, 1]."""
    if mask.ndim == 1:
        return mask[None, None, :, None]
    return mask[:, None, :, None]


def _per_head_vector(delta: jax.Array) -> jax.Array:
    """[h, d] -> [1, 1, h, d]; [b, h, d] -> [b, 1, h, d]."""
    return delta[None, None] if delta.ndim == 2 else delta[:, None]


class Block(nnx.Module):
    """Pre-norm block: x + attn(norm(x)), then + ffn(norm(x))."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        if config.ffn_type not in FFN_TYPES:
            raise ValueError(f"unknown ffn_type {config.ffn_type!r}; registered: {sorted(FFN_TYPES)}")
        self.attn_norm = RMSNorm(config.d_model, eps=config.norm_eps)
        self.attn = Attention(config, rngs=rngs)
        self.ffn_norm = RMSNorm(config.d_model, eps=config.norm_eps)
        self.ffn = FFN_TYPES[config.ffn_type](config, rngs=rngs)

    def __call__(self, x, positions, *, router_bias=None, **attn_kwargs):
        a, heads, new_cache, extras = self.attn(self.attn_norm(x), positions, **attn_kwargs)
        x = x + a
        ffn_kwargs = {} if router_bias is None else {"router_bias": router_bias}
        f, aux = self.ffn(self.ffn_norm(x), **ffn_kwargs)
        return x + f, heads, new_cache, aux, extras


class TransformerOutput(NamedTuple):
    """Result of a forward pass.

    Attributes:
      logits: [b, t, v] float32 ([b, r, v] when `logits_at` was given).
      cache: the updated KVCache, or None when no cache was passed.
      aux_loss: scalar sum of the FFNs' `aux["loss"]` (0 for dense FFNs).
      intermediates: None, or a dict with `residuals` [L+1, b, t, D],
        `head_outputs` [L, b, t, h, d] and `ffn_aux` (tuple of L dicts) when
        `return_intermediates`, `attn_scores` [L, b, h, R, S] and `attn_lse`
        [L, b, h, t] when `score_rows` was given, and `ffd_kept_fraction` [L] on an FFD
        decode step.
    """

    logits: jax.Array
    cache: KVCache | None
    aux_loss: jax.Array
    intermediates: dict[str, Any] | None


class Transformer(nnx.Module):
    """Decoder-only LM. See the module docstring for the hooks it exposes.

    Examples:
      >>> from flax import nnx
      >>> import jax.numpy as jnp
      >>> cfg = TransformerConfig(vocab_size=11, d_model=16, num_layers=1, num_heads=2,
      ...                         num_kv_heads=1, d_ff=32)
      >>> model = Transformer(cfg, rngs=nnx.Rngs(0))
      >>> model(jnp.zeros((2, 5), jnp.int32)).logits.shape
      (2, 5, 11)
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.embed = _param(rngs, (config.vocab_size, config.d_model), ("vocab", "embed"), config.init_std)
        if config.scan_layers:  # one Block whose parameters carry a leading "layers" axis of size L
            @nnx.split_rngs(splits=config.num_layers)
            @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
            def stacked(rngs):
                return Block(config, rngs=rngs)

            self.layers = stacked(rngs)
        else:
            self.layers = nnx.List([Block(config, rngs=rngs) for _ in range(config.num_layers)])
        self.final_norm = RMSNorm(config.d_model, eps=config.norm_eps)
        if not config.tie_embeddings:
            self.unembed = _param(rngs, (config.d_model, config.vocab_size), ("embed", "vocab"),
                                  1 / math.sqrt(config.d_model))

    def init_cache(self, batch_size: int, capacity: int) -> KVCache:
        """An empty KV cache for this model (with FFD page slots when `attention.decode` is "ffd"; their int8
        scan keys only where the XLA path runs, i.e. not when compiling for TPU or GPU)."""
        c = self.config
        ffd = c.attention.ffd if c.attention.decode == "ffd" else None
        return init_cache(num_layers=c.num_layers, batch_size=batch_size, capacity=capacity,
                          num_kv_heads=c.num_kv_heads, head_dim=c.resolved_head_dim, dtype=c.compute_dtype,
                          layout=c.resolved_kv_layout, ffd_page_size=None if ffd is None else ffd.page_size,
                          ffd_bits=2 if ffd is None else ffd.bits,
                          ffd_residual_dtype=jnp.float32 if ffd is None else jnp.dtype(ffd.residual_dtype),
                          # the int8 scan keys serve the XLA (CPU) path only; a kernel reads the codes
                          ffd_scan_keys=kernel_backend.resolve_implementation(None) == "xla")

    def __call__(
        self,
        tokens: jax.Array,
        *,
        input_embeddings: jax.Array | None = None,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        cache: KVCache | None = None,
        num_valid: jax.Array | None = None,
        head_mask: jax.Array | None = None,
        head_deltas: jax.Array | None = None,
        residual_deltas: jax.Array | None = None,
        router_biases: jax.Array | None = None,
        return_intermediates: bool = False,
        score_rows: tuple[int, ...] | None = None,
        sparse_decode: SparseDecode | None = None,
        logits_at: jax.Array | None = None,
        attention_bias: Callable[[int, jax.Array, jax.Array], jax.Array] | None = None,
    ) -> TransformerOutput:
        """Runs the LM on `tokens` [b, t].

        Args:
          tokens: [b, t] int token ids in [0, vocab_size). A float array raises TypeError; concrete
            ids outside the vocabulary raise ValueError. Inside `jit` (nnx.jit, `generate`,
            `fit`) the ids are traced and not checked: an out-of-range id then embeds as NaN, so
            validate before (`primitives.validation.check_token_ids`; `generate` does).
          input_embeddings: [b, t, D] inputs that replace the embedding lookup of `tokens` (which
            then only give the shape): e.g. `models.vlm`'s image/audio/text sequence.
          positions: [b, t] positions for RoPE and the causal mask. Default:
            0..t-1 without a cache, `cache.lengths + arange(t)` with one.
          segment_ids: [b, t] packing segments (no cross-segment attention).
            Not allowed together with a cache.
          cache: a KVCache to append these tokens to.
          num_valid: [b] with a cache, how many of the t tokens per row are real
            (the rest is right padding); the cache advances by this. Default t.
          head_mask: [L, h] or [L, b, h] multipliers of head outputs.
          head_deltas: [L, h, d] or [L, b, h, d] additions to head outputs.
          residual_deltas: [L, D], [L, b, D] or [L, b, t, D] additions to the
            residual stream after each block.
          router_biases: [L, E] or [L, b, E] additive router-logit vectors of an
            MoE FFN (ignored by dense FFNs); None or zeros leave the logits unchanged.
          return_intermediates: also return residual streams, head outputs and
            FFN auxiliaries.
          score_rows: with a cache, query rows (in [0, t)) whose raw attention
            scores over the cache each layer returns, with every row's lse
            (the Vegas verification pass).
          sparse_decode: with a cache and t == 1, attend only to the drafter's
            keys plus the recent range (a Vegas / StreamingLLM / Quest draft step).
          logits_at: [b, r] int positions in [0, t) whose logits are computed
            (e.g. the last prompt token of a prefill); the output logits are
            then [b, r, v]. Default: every position. The unembedding of a long
            prefill over a large vocabulary is then r/t of its full cost.
          attention_bias: `attention_bias(layer, q, k) -> [b, h, t, s]` float additive attention
            logits of layer `layer` (added after the 1/sqrt(d) scale, before the masks), from its
            rotated queries q [b, t, h, d] and keys k [b, s, k, d] (with a cache, s is the cache
            capacity, token-major). Dense attention paths only: not with score_rows or
            sparse_decode; a one-token decode step then runs dense attention.

        Returns:
          TransformerOutput.
        """
        c = self.config
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be [b, t]; got shape {tokens.shape}")
        check_token_ids("tokens", tokens, c.vocab_size)  # dtype always; values only when concrete
        b, t = tokens.shape
        explicit_positions = positions is not None
        self._check_hooks(b, t, head_mask, head_deltas, residual_deltas)
        if router_biases is not None:
            E = c.moe.num_experts
            shapes = [(c.num_layers, E), (c.num_layers, b, E)]
            if c.ffn_type == "moe" and tuple(router_biases.shape) not in shapes:
                raise ValueError(f"router_biases must have one of the shapes {shapes}; got {tuple(router_biases.shape)}")
            if router_biases.ndim < 1 or router_biases.shape[0] != c.num_layers:
                raise ValueError(f"router_biases must have a leading layer dim L={c.num_layers}; "
                                 f"got {tuple(router_biases.shape)}")
        if cache is not None:
            if segment_ids is not None:
                raise ValueError("segment_ids cannot be combined with a KV cache")
            if cache.batch_size != b:
                raise ValueError(f"cache batch size {cache.batch_size} != tokens batch size {b}")
            if len(cache.keys) != c.num_layers:
                raise ValueError(f"cache has {len(cache.keys)} layers; model has {c.num_layers}")
            if positions is None:
                positions = cache.lengths[:, None] + jnp.arange(t)[None, :]
        elif positions is None:
            positions = jnp.broadcast_to(jnp.arange(t)[None, :], (b, t))
        if (score_rows is not None or sparse_decode is not None) and cache is None:
            raise ValueError("score_rows and sparse_decode need a KV cache")
        if score_rows is not None and sparse_decode is not None:
            raise ValueError("pass score_rows (verification) or sparse_decode (drafting), not both")
        if sparse_decode is not None and t != 1:
            raise ValueError(f"sparse_decode is for one-token steps; got t={t}")
        if attention_bias is not None and (score_rows is not None or sparse_decode is not None):
            raise ValueError("attention_bias applies to dense attention only; not with score_rows or sparse_decode")

        if input_embeddings is None:
            x = jnp.take(self.embed[...], tokens, axis=0).astype(c.compute_dtype)
        else:
            if tuple(input_embeddings.shape) != (b, t, c.d_model):
                raise ValueError(f"input_embeddings must be [b, t, D]=({b}, {t}, {c.d_model}); "
                                 f"got shape {tuple(input_embeddings.shape)}")
            x = input_embeddings.astype(c.compute_dtype)
        aux_loss = jnp.zeros((), jnp.float32)
        if c.scan_layers:
            unsupported = {"cache": cache, "head_mask": head_mask, "head_deltas": head_deltas,
                           "residual_deltas": residual_deltas, "router_biases": router_biases,
                           "score_rows": score_rows, "sparse_decode": sparse_decode,
                           "attention_bias": attention_bias, "return_intermediates": return_intermediates or None}
            given = [name for name, value in unsupported.items() if value is not None]
            if given:
                raise ValueError(f"a scan_layers model takes no {', '.join(given)} (a training and scoring layout); "
                                 "build the model with scan_layers=False for these")
            x, aux_loss = self._scan_blocks(shard_batch(x), positions, segment_ids, not explicit_positions, aux_loss)
            return self._logits(x, logits_at, None, aux_loss, None)
        residuals, head_outputs, ffn_aux = [x], [], []
        new_keys, new_values, new_pages, attn_scores, attn_lse, kept = [], [], [], [], [], []
        if cache is not None:
            advance = jnp.full((b,), t, jnp.int32) if num_valid is None else num_valid.astype(jnp.int32)
            new_lengths = cache.lengths + advance
        for l, layer in enumerate(self.layers):
            sparse = None
            if sparse_decode is not None:
                sparse = (functools.partial(sparse_decode.select, l), sparse_decode.recent_start,
                          int(sparse_decode.max_recent))
            x, heads, new_kv, aux, extras = _call_block(
                layer, x, positions, c.remat,
                segment_ids=segment_ids,
                layer_cache=None if cache is None else (cache.keys[l], cache.values[l],
                                                        None if cache.pages is None else cache.pages[l]),
                cache_lengths=None if cache is None else cache.lengths,
                new_lengths=None if cache is None else new_lengths,
                kv_layout="bskd" if cache is None else cache.layout,
                head_mask=None if head_mask is None else head_mask[l],
                head_delta=None if head_deltas is None else head_deltas[l],
                router_bias=None if router_biases is None else router_biases[l],
                score_rows=score_rows,
                sparse_decode=sparse,
                bias_fn=None if attention_bias is None else functools.partial(attention_bias, l),
                default_positions=not explicit_positions,
            )
            if score_rows is not None:
                attn_scores.append(extras["scores"])
                attn_lse.append(extras["lse"])
            if "ffd_kept_fraction" in extras:
                kept.append(extras["ffd_kept_fraction"])
            if residual_deltas is not None:
                x = x + _residual_delta(residual_deltas[l]).astype(x.dtype)
            if "loss" in aux:
                aux_loss = aux_loss + aux["loss"]
            if new_kv is not None:
                new_keys.append(new_kv[0])
                new_values.append(new_kv[1])
                new_pages.append(new_kv[2])
            if return_intermediates:
                residuals.append(x)
                head_outputs.append(heads)
                ffn_aux.append(aux)

        new_cache = None
        if cache is not None:
            new_cache = KVCache(tuple(new_keys), tuple(new_values), new_lengths, cache.layout,
                                None if cache.pages is None else tuple(new_pages))
        intermediates = None
        if return_intermediates:
            intermediates = {
                "residuals": jnp.stack(residuals),
                "head_outputs": jnp.stack(head_outputs),
                "ffn_aux": tuple(ffn_aux),
            }
        if score_rows is not None:
            intermediates = dict(intermediates or {}, attn_scores=jnp.stack(attn_scores),
                                 attn_lse=jnp.stack(attn_lse))
        if kept:
            intermediates = dict(intermediates or {}, ffd_kept_fraction=jnp.stack(kept))
        return self._logits(x, logits_at, new_cache, aux_loss, intermediates)

    def _scan_blocks(self, x, positions, segment_ids, default_positions, aux_loss):
        """The L stacked blocks of a `scan_layers` model over x [b, t, D]: (x, summed auxiliary loss)."""

        def block_step(carry, block):
            x, aux_loss = carry
            x, _, _, aux, _ = block(x, positions, segment_ids=segment_ids, default_positions=default_positions)
            return shard_batch(x), aux_loss + aux.get("loss", 0.0)

        step = _rematted(block_step, self.config.remat)
        return nnx.scan(step, in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)((x, aux_loss), self.layers)

    def _logits(self, x, logits_at, new_cache, aux_loss, intermediates) -> TransformerOutput:
        """The final norm and output projection of the residual stream x [b, t, D] (at `logits_at` rows)."""
        c = self.config
        if logits_at is not None:
            logits_at = jnp.asarray(logits_at)
            if logits_at.ndim != 2 or logits_at.shape[0] != x.shape[0]:
                raise ValueError(f"logits_at must be [b={x.shape[0]}, r] positions; got shape {logits_at.shape}")
            x = jnp.take_along_axis(x, logits_at.astype(jnp.int32)[:, :, None], axis=1)
        h = self.final_norm(x)
        if c.tie_embeddings:
            logits = jnp.einsum("btD,vD->btv", h, self.embed[...].astype(c.compute_dtype))
        else:
            logits = h @ self.unembed[...].astype(c.compute_dtype)
        return TransformerOutput(logits.astype(jnp.float32), new_cache, aux_loss, intermediates)

    def _check_hooks(self, b, t, head_mask, head_deltas, residual_deltas):
        c = self.config
        L, h, d, D = c.num_layers, c.num_heads, c.resolved_head_dim, c.d_model
        allowed = {
            "head_mask": (head_mask, [(L, h), (L, b, h)]),
            "head_deltas": (head_deltas, [(L, h, d), (L, b, h, d)]),
            "residual_deltas": (residual_deltas, [(L, D), (L, b, D), (L, b, t, D)]),
        }
        for name, (value, shapes) in allowed.items():
            if value is not None and tuple(value.shape) not in shapes:
                raise ValueError(f"{name} must have one of the shapes {shapes}; got {tuple(value.shape)}")


def batch_axes_in_context(batch_size: int) -> tuple[str, str] | None:
    """("data", "fsdp") when a mesh context with both axes is set and `batch_size` splits over them, else None."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not {"data", "fsdp"} <= set(mesh.axis_names):
        return None
    return None if batch_size % (mesh.shape["data"] * mesh.shape["fsdp"]) else ("data", "fsdp")


def shard_batch(x: jax.Array) -> jax.Array:
    """x [b, ...] constrained to batch-sharded over the ("data", "fsdp") axes of the mesh in context.

    Without it the partitioner may follow the fully sharded weights and split activations along the
    model width instead, computing every sequence's attention on every chip. A no-op outside a mesh
    context (`jax.set_mesh`, which `algorithms.training.make_train_step` enters) or when the batch does not
    divide over those axes.
    """
    batch = batch_axes_in_context(x.shape[0])
    return x if batch is None else jax.lax.with_sharding_constraint(x, jax.sharding.PartitionSpec(batch))


def _flash_prefill(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Causal `flash_attention` of q [b, t, h, d] over k, v [b, t, k, d]; inside a mesh context, one call per
    shard (`jax.shard_map`: a Pallas TPU kernel cannot be partitioned automatically): the batch split over
    ("data", "fsdp") and the heads over "tensor" where they divide (GQA groups stay whole: h and k both split)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return flash_kernel.flash_attention(q, k, v, causal=True)
    batch = batch_axes_in_context(q.shape[0])
    tensor = mesh.shape.get("tensor", 1)
    heads = "tensor" if "tensor" in mesh.axis_names and q.shape[2] % tensor == 0 and k.shape[2] % tensor == 0 else None
    spec = jax.sharding.PartitionSpec(batch, None, heads, None)
    sharded = jax.shard_map(lambda q, k, v: flash_kernel.flash_attention(q, k, v, causal=True), mesh=mesh,
                            in_specs=(spec, spec, spec), out_specs=spec, check_vma=False)
    return sharded(q, k, v)


def _rematted(fn, remat: str):
    """`fn` (a function taking its modules as arguments) rematerialised under `REMAT_POLICIES[remat]`."""
    if remat == "none":
        return fn
    return nnx.remat(fn, policy=REMAT_POLICIES[remat])


def _call_block(block: Block, x, positions, remat: str, **kwargs):
    """``block(x, positions, **kwargs)``, rematerialised per `remat` (the hooks in kwargs are closed over)."""
    return _rematted(lambda blk, x: blk(x, positions, **kwargs), remat)(block, x)


def _residual_delta(delta: jax.Array) -> jax.Array:
    """[D] -> [1, 1, D]; [b, D] -> [b, 1, D]; [b, t, D] unchanged."""
    if delta.ndim == 1:
        return delta[None, None]
    if delta.ndim == 2:
        return delta[:, None]
    return delta
