"""Mixture-of-experts FFN for the decoder LM (`ffn_type="moe"`): top-k softmax routing, dropless.

Dimension legend: `b` batch, `t` tokens, `D` model width, `E` experts, `k` experts per token,
`f` expert hidden width, `S` shared experts, `L` layers, `m = b * t` tokens, `n = m * k`.

Build an MoE LM by setting `ffn_type="moe"` and the `moe` section (`MoEConfig`) of `TransformerConfig`:

    cfg = TransformerConfig(vocab_size=64, d_model=64, num_layers=4, num_heads=4, num_kv_heads=2,
                            d_ff=128, ffn_type="moe", moe=MoEConfig(num_experts=8, experts_per_token=2))
    model = Transformer(cfg, rngs=nnx.Rngs(0))

Every block's FFN is then an `MoEFFN`: router logits `z = x W_r (+ bias)` (float32) on the block's
*normed* FFN input x, softmax over all E experts, the top-k experts with gates (renormalized over
the k or not: `moe.router_renormalize`), E gated (SwiGLU/GeGLU) experts computed dropless — assignments
sorted by expert, three grouped matmuls (`pallas_kernels.grouped_matmul`, implementation from
`moe.implementation`), unsorted and combined with the gates — plus `moe.num_shared_experts` always-on
experts. The layer's auxiliary loss is `moe.load_balance_weight * E sum_e f_e P_e +
moe.router_z_weight * mean logsumexp(z)^2`, summed over layers into `TransformerOutput.aux_loss` (and
so into `algorithms.training.next_token_loss`).

Reading the router (for test-time rerouting, RouterInterp, ...):

    out = model(tokens, return_intermediates=True)
    for l, aux in enumerate(out.intermediates["ffn_aux"]):
        aux["router_logits"]   # [b, t, E] float32, bias included (what the gate sees)
        aux["router_inputs"]   # [b, t, D] the normed input the router multiplies
        aux["router_probs"]    # [b, t, E] softmax over all experts
        aux["expert_indices"]  # [b, t, k] int32, decreasing probability
        aux["gates"]           # [b, t, k] float32
        aux["loss"]            # scalar: this layer's weighted load-balance + z-loss
    model.layers[l].ffn.router_rows()  # [E, D] router rows r_e (logits = x @ rows.T)

Router biases (the additive per-layer logit vector delta of test-time rerouting) are an argument,
not a parameter: `model(tokens, router_biases=delta)` with `delta` [L, E] (one vector per layer,
shared by all tokens) or [L, b, E] (one per sequence). `None`, or all zeros, gives bitwise the
same logits as the unbiased model. Rows of layers you do not adapt are simply zeros. The bias works
with the KV cache too (`model(tokens, cache=cache, router_biases=delta)`); a cache filled with a
different bias is stale, so re-prefill after changing it. To differentiate w.r.t. the bias only,
close over a frozen model: `jax.grad(lambda d: loss(model(tokens, router_biases=d).logits))(delta)`.

References:
  Shazeer et al., "Outrageously Large Neural Networks: The Sparsely-Gated Mixture-of-Experts
    Layer", arXiv:1701.06538, 2017.
  Fedus, Zoph, Shazeer, "Switch Transformers", arXiv:2101.03961, 2021.
  Gale et al., "MegaBlocks: Efficient Sparse Training with Mixture-of-Experts", arXiv:2211.15841, 2022.
  Dai et al., "DeepSeekMoE: Towards Ultimate Expert Specialization in Mixture-of-Experts Language
    Models", arXiv:2401.06066, 2024 (shared experts).
  Su et al., "Rewiring Experts on the Fly", arXiv:2510.14853, 2025 (router biases).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from models.transformer import _ACTIVATIONS, TransformerConfig, _param, batch_axes_in_context, register_ffn
from pallas_kernels import grouped_matmul as gmm_lib
from primitives import routing

__all__ = ["MoEFFN", "dense_moe_reference"]


class MoEFFN(nnx.Module):
    """Top-k routed gated experts (+ shared experts). Maps [b, t, D] -> ([b, t, D], aux dict).

    See the module docstring for the aux entries and router biases.
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        moe = config.moe
        D, E = config.d_model, moe.num_experts
        f = config.resolved_moe_d_ff
        self.w_router = _param(rngs, (D, E), ("embed", "expert"), 1 / math.sqrt(D))
        self.w_gate = _param(rngs, (E, D, f), ("expert", "embed", "mlp"), 1 / math.sqrt(D))
        self.w_up = _param(rngs, (E, D, f), ("expert", "embed", "mlp"), 1 / math.sqrt(D))
        self.w_down = _param(rngs, (E, f, D), ("expert", "mlp", "embed"), 1 / math.sqrt(f))
        self.num_shared = moe.num_shared_experts
        if self.num_shared:
            fs = f * self.num_shared  # S shared SwiGLU experts summed == one of width S * f
            self.shared_gate = _param(rngs, (D, fs), ("embed", "mlp"), 1 / math.sqrt(D))
            self.shared_up = _param(rngs, (D, fs), ("embed", "mlp"), 1 / math.sqrt(D))
            self.shared_down = _param(rngs, (fs, D), ("mlp", "embed"), 1 / math.sqrt(fs))
        self.num_experts = E
        self.k = moe.experts_per_token
        self.renormalize = moe.router_renormalize
        self.load_balance_weight = moe.load_balance_weight
        self.router_z_weight = moe.router_z_weight
        self.implementation = moe.implementation
        self.activation = config.ffn_activation
        self.dtype = config.compute_dtype

    def router_rows(self) -> jax.Array:
        """[E, D] router rows r_e (logit of expert e = r_e . x)."""
        return self.w_router[...].T

    def __call__(self, x: jax.Array, *, router_bias: jax.Array | None = None):
        """Args: x [b, t, D]; router_bias None, [E] or [b, E]. Returns (y [b, t, D], aux)."""
        b, t, D = x.shape
        E, k = self.num_experts, self.k
        if router_bias is not None and router_bias.shape not in ((E,), (b, E)):
            raise ValueError(f"router_bias must be [E]=({E},) or [b, E]=({b}, {E}); got {router_bias.shape}")
        act = _ACTIVATIONS[self.activation]
        if router_bias is None or router_bias.ndim == 1:
            logits = routing.router_logits(x, self.w_router[...], router_bias)
        else:
            logits = routing.router_logits(x, self.w_router[...]) + router_bias[:, None, :].astype(jnp.float32)
        r = routing.top_k_gating(logits, k, renormalize=self.renormalize)

        def experts(x, indices, gates, w_gate, w_up, w_down):  # x [b, t, D] -> the routed experts' sum
            bl = x.shape[0]
            dispatch = routing.dispatch_metadata(indices.reshape(bl * t, k), E)
            xs = routing.sort_by_expert(x.reshape(bl * t, D), dispatch)  # [n, D]
            gmm = lambda lhs, w: gmm_lib.grouped_matmul(lhs, w, dispatch.group_sizes,  # noqa: E731
                                                        implementation=self.implementation)
            ys = gmm(act(gmm(xs, w_gate)) * gmm(xs, w_up), w_down)  # [n, D]
            return routing.combine(ys, gates.reshape(bl * t, k), dispatch).reshape(bl, t, D)

        weights = tuple(w[...].astype(self.dtype) for w in (self.w_gate, self.w_up, self.w_down))
        batch = batch_axes_in_context(b)
        if batch is not None:
            # Inside a training mesh each batch shard dispatches its own tokens to every expert (the expert
            # weights gathered per layer, as FSDP does): a Pallas TPU kernel cannot be partitioned
            # automatically, so the grouped matmuls run per shard.
            spec, whole = jax.sharding.PartitionSpec(batch), jax.sharding.PartitionSpec()
            experts = jax.shard_map(experts, mesh=jax.sharding.get_abstract_mesh(),
                                    in_specs=(spec, spec, spec, whole, whole, whole), out_specs=spec,
                                    check_vma=False)
        y = experts(x, r.indices, r.gates, *weights)
        if self.num_shared:
            sg, su, sd = (w[...].astype(self.dtype) for w in (self.shared_gate, self.shared_up, self.shared_down))
            y = y + (act(x @ sg) * (x @ su)) @ sd

        loss = jnp.zeros((), jnp.float32)
        if self.load_balance_weight:
            loss = loss + self.load_balance_weight * routing.load_balancing_loss(r.probs, r.indices)
        if self.router_z_weight:
            loss = loss + self.router_z_weight * routing.router_z_loss(logits)
        aux = {"router_logits": logits, "router_inputs": x, "router_probs": r.probs,
               "expert_indices": r.indices, "gates": r.gates, "loss": loss}
        return y.astype(x.dtype), aux


def dense_moe_reference(ffn: MoEFFN, x: jax.Array, *, router_bias: jax.Array | None = None) -> jax.Array:
    """Every expert on every token, combined with the top-k gate mask (the independent check).

    Args:
      ffn: an MoEFFN.
      x: [b, t, D].
      router_bias: as in `MoEFFN.__call__`.

    Returns:
      [b, t, D], equal to `ffn(x, router_bias=...)[0]` up to rounding.
    """
    act = _ACTIVATIONS[ffn.activation]
    logits = x.astype(jnp.float32) @ ffn.w_router[...]
    if router_bias is not None:
        logits = logits + (router_bias if router_bias.ndim == 1 else router_bias[:, None, :])
    probs = jax.nn.softmax(logits, axis=-1)
    top, idx = jax.lax.top_k(probs, ffn.k)
    if ffn.renormalize:
        top = top / top.sum(-1, keepdims=True)
    gate_full = jnp.sum(jax.nn.one_hot(idx, ffn.num_experts) * top[..., None], axis=-2)  # [b, t, E]
    wg, wu, wd = (w[...].astype(ffn.dtype) for w in (ffn.w_gate, ffn.w_up, ffn.w_down))
    h = act(jnp.einsum("btD,eDf->btef", x, wg)) * jnp.einsum("btD,eDf->btef", x, wu)
    y = jnp.einsum("btef,efD,bte->btD", h, wd, gate_full.astype(h.dtype))
    if ffn.num_shared:
        sg, su, sd = (w[...].astype(ffn.dtype) for w in (ffn.shared_gate, ffn.shared_up, ffn.shared_down))
        y = y + (act(x @ sg) * (x @ su)) @ sd
    return y.astype(x.dtype)


register_ffn("moe", MoEFFN)
