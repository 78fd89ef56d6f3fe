"""Hyper-ICL: low-rank attention-logit calibration distilled from an in-context teacher by a hyperbolic anchor.

Dimension legend: `b` batch, `t` query tokens, `s` key tokens, `h` query heads, `k` key/value heads,
`d` head dim, `r` adapter rank, `L` layers, `D` model width, `v` vocabulary, `n` training queries.

The student is a frozen decoder LM (`models.Transformer`) that reads the query only; on every layer and
head a low-rank, query-gated additive term calibrates its attention logits (spec eqs. 5-9):

    A = Q U_q,  B = K U_k                   U_q, U_k in R^{d x r}                    (6)
    Delta = A B^T / sqrt(r)                 [t, s]                                    (7)
    g = sigmoid(LN(Q) w + b)                one gate per query token, in (0, 1)       (9)
    S~ = Q K^T / sqrt(d) + Diag(g) Delta    then the causal mask and softmax          (5)
    O~ = softmax(S~) V                                                                (8)

It is passed to the model as its `attention_bias(layer, q, k)` hook (`make_attention_bias`), which adds
`g * Delta` to the scaled logits before the mask, so the model's own attention computes eqs. (5)/(8).
The teacher is the same frozen LM with m demonstrations prepended; its residual stream after every
block at the query tokens (the last t positions) is the anchor. The loss (eqs. 12-17) is

    L = L_H-anchor + lambda * L_sup,   L_H-anchor = (1/L) sum_l (1/t) sum_i d_L^2(exp_o(LN h'_i^l), exp_o(LN h_i^l))

with `primitives.hyperbolic.anchor_loss` (which matches eq. 16: parameter-free LN, exp map at the
origin of the Lorentz model of curvature -kappa, squared geodesic distance averaged over tokens, then
layers) and L_sup the cross-entropy of the answer token. `train` optimizes only the adapter (AdamW,
cosine schedule with linear warm-up); the base LM's parameters are constants of the loss.

Methods (`METHODS`), the spec's loss ablation and value-stream baseline:
  * "h_anchor": calibration adapter, L_H-anchor + lambda L_sup (Hyper-ICL);
  * "l2_anchor": calibration adapter, L_L2-anchor + lambda L_sup, L_L2 = the same layer/token average
    of |LN h' - LN h|^2 (the kappa -> 0 limit of d_L^2);
  * "sup": calibration adapter, L_sup only;
  * "additive": a value-stream baseline instead of the calibration: a learned shift added to every
    head's output (`head_deltas` hook), trained with the Hyper-ICL loss.

Inferred parts ([INFER], the paper does not say):
  * initialisation: U_k = 0 (so Delta = 0 and the student equals the base LM at init),
    U_q ~ N(0, 1/d), w = 0, b = 0 (g = 0.5) -- the spec's [INFER];
  * the gate's LN over each head's query vector has a learnable per-head scale and bias (init 1, 0);
    the anchor's LN is parameter-free (spec section 9 (f));
  * GQA: U_k is per query head, applied to the key head that query head reads (jnp.repeat of the keys);
  * the calibration acts on the RoPE-rotated q and k the model attends with (the hook's inputs);
  * "hidden state h^(l)" = the residual stream after block l, l = 1..L (not the attention output);
    teacher and student are aligned on the last t (query) positions;
  * the L2 anchor's exact form (squared Euclidean distance of the LN'd states, same averaging);
  * the "additive" baseline is a simplified MimIC/LIVE-style shift: one learned vector per layer and
    head added to that head's output at every token (MimIC's query-dependent magnitude would need a
    per-token head-output hook, which `models.Transformer` does not have); its loss is Hyper-ICL's;
  * weight decay 0.01 on matrices only, gradient clipping at norm 1.

Spec: /work/shared/papers/specs/rl_alignment_agents.md, section 9 (Hyper-ICL), eqs. (5)-(17), defaults
r = 4, kappa = 0.1, lambda = 0.5, AdamW lr 5e-3, cosine schedule with 10% warm-up.

References:
  Alipour Talemi, Kashiani, Afghah, "Attention Calibration with Hyperbolic Anchor Distillation for
  Multimodal In-Context Learning" (Hyper-ICL), arXiv:2606.04434, 2026.
  Jiang et al., "Mimic In-Context Learning for Multimodal Tasks" (MimIC), arXiv:2504.08851, 2025.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> p = init_adapter(jax.random.key(0), num_layers=1, num_heads=2, head_dim=4, rank=2)
  >>> q = jax.random.normal(jax.random.key(1), (1, 3, 2, 4)); k = q[:, :, :1]
  >>> float(jnp.abs(calibration_bias(q, k, layer_params(p, 0))).max())  # U_k = 0: no calibration
  0.0
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm.auto import tqdm

from primitives import attention as attn_lib
from primitives import hyperbolic

__all__ = [
    "METHODS",
    "ADAPTER_KEYS",
    "init_adapter",
    "init_additive",
    "layer_params",
    "query_gate",
    "calibration_bias",
    "calibrated_attention",
    "make_attention_bias",
    "forward",
    "teacher_hidden_states",
    "hyperbolic_anchor_loss",
    "euclidean_anchor_loss",
    "supervised_loss",
    "method_loss",
    "TrainConfig",
    "TrainResult",
    "train",
    "adapter_param_count",
    "forward_flops",
]

METHODS = ("h_anchor", "l2_anchor", "sup", "additive")
ADAPTER_KEYS = ("u_q", "u_k", "w", "b", "ln_scale", "ln_bias")
_LN_EPS = 1e-5


def _check_rank(rank) -> int:
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 1:
        raise ValueError(f"rank must be an int >= 1; got {rank!r}")
    return int(rank)


def _check_curvature(curvature) -> float:
    try:
        c = float(curvature)
    except (TypeError, ValueError):
        raise ValueError(f"curvature (kappa) must be a finite number > 0; got {curvature!r}") from None
    if not math.isfinite(c) or c <= 0:
        raise ValueError(f"curvature (kappa) must be a finite number > 0; got {curvature!r}")
    return c


def init_adapter(key: jax.Array, *, num_layers: int, num_heads: int, head_dim: int, rank: int = 4) -> dict:
    """Initial calibration-adapter parameters for every layer and head ([INFER] init, see module docstring).

    Args:
      key: PRNG key (for U_q).
      num_layers, num_heads, head_dim: L, h, d of the base LM.
      rank: r >= 1 (the paper's default 4).

    Returns:
      dict with u_q [L, h, d, r] ~ N(0, 1/d), u_k [L, h, d, r] = 0, w [L, h, d] = 0, b [L, h] = 0,
      ln_scale [L, h, d] = 1, ln_bias [L, h, d] = 0 (float32). Per head 2 d r + d + 1 calibration
      parameters plus 2 d for the gate's LN.
    """
    rank = _check_rank(rank)
    for name, value in (("num_layers", num_layers), ("num_heads", num_heads), ("head_dim", head_dim)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be an int >= 1; got {value!r}")
    L, h, d = int(num_layers), int(num_heads), int(head_dim)
    return {
        "u_q": jax.random.normal(key, (L, h, d, rank), jnp.float32) / math.sqrt(d),
        "u_k": jnp.zeros((L, h, d, rank), jnp.float32),
        "w": jnp.zeros((L, h, d), jnp.float32),
        "b": jnp.zeros((L, h), jnp.float32),
        "ln_scale": jnp.ones((L, h, d), jnp.float32),
        "ln_bias": jnp.zeros((L, h, d), jnp.float32),
    }


def init_additive(*, num_layers: int, num_heads: int, head_dim: int) -> dict:
    """Initial parameters of the additive (value-stream) baseline: {"shift": zeros [L, h, d]} (identity)."""
    return {"shift": jnp.zeros((num_layers, num_heads, head_dim), jnp.float32)}


def layer_params(params: Mapping[str, jax.Array], layer: int) -> dict:
    """The adapter parameters of one layer (index `layer` of every [L, ...] array)."""
    missing = [name for name in ADAPTER_KEYS if name not in params]
    if missing:
        raise ValueError(f"params must hold {list(ADAPTER_KEYS)}; missing {missing}")
    return {name: params[name][layer] for name in ADAPTER_KEYS}


def _check_layer_params(p: Mapping[str, jax.Array], h: int, d: int) -> int:
    missing = [name for name in ADAPTER_KEYS if name not in p]
    if missing:
        raise ValueError(f"params must hold {list(ADAPTER_KEYS)} of one layer; missing {missing}")
    u_q, u_k = p["u_q"], p["u_k"]
    if u_q.ndim != 3 or tuple(u_q.shape[:2]) != (h, d):
        raise ValueError(f"params['u_q'] must be [h, d, r] = [{h}, {d}, r]; got {tuple(u_q.shape)}")
    if tuple(u_k.shape) != tuple(u_q.shape):
        raise ValueError(f"params['u_k'] must have u_q's shape {tuple(u_q.shape)}; got {tuple(u_k.shape)}")
    for name, shape in (("w", (h, d)), ("b", (h,)), ("ln_scale", (h, d)), ("ln_bias", (h, d))):
        if tuple(p[name].shape) != shape:
            raise ValueError(f"params['{name}'] must be {list(shape)}; got {tuple(p[name].shape)}")
    return int(u_q.shape[-1])


def query_gate(q: jax.Array, params: Mapping[str, jax.Array]) -> jax.Array:
    """The query-adaptive gate g = sigmoid(LN(Q) w + b) of eq. (9), one per (batch, head, query token).

    Args:
      q: [b, t, h, d] queries of one layer.
      params: that layer's adapter (`layer_params`): w [h, d], b [h], ln_scale / ln_bias [h, d].

    Returns:
      [b, h, t] float32 gates in (0, 1).
    """
    if q.ndim != 4:
        raise ValueError(f"q must be [b, t, h, d]; got shape {tuple(q.shape)}")
    _check_layer_params(params, q.shape[2], q.shape[3])
    qf = q.astype(jnp.float32)
    mean = jnp.mean(qf, axis=-1, keepdims=True)
    var = jnp.mean((qf - mean) ** 2, axis=-1, keepdims=True)
    ln = (qf - mean) * jax.lax.rsqrt(var + _LN_EPS) * params["ln_scale"] + params["ln_bias"]
    logit = jnp.einsum("bthd,hd->bht", ln, params["w"]) + params["b"][None, :, None]
    return jax.nn.sigmoid(logit)


def calibration_bias(q: jax.Array, k: jax.Array, params: Mapping[str, jax.Array]) -> jax.Array:
    """The additive calibration Diag(g) Delta of eqs. (5)-(7), (9) for one layer.

    Args:
      q: [b, t, h, d] (rotated) queries.
      k: [b, s, k, d] (rotated) keys, k | h (GQA: query head i reads key head i // (h / k)).
      params: that layer's adapter (`layer_params`).

    Returns:
      [b, h, t, s] float32 logits g_i * (q_i U_q)(k_j U_k)^T / sqrt(r), to be added to Q K^T / sqrt(d)
      before the mask and softmax.
    """
    if q.ndim != 4:
        raise ValueError(f"q must be [b, t, h, d]; got shape {tuple(q.shape)}")
    if k.ndim != 4 or k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3] or q.shape[2] % k.shape[2]:
        raise ValueError(f"k must be [b, s, k, d] with b = {q.shape[0]}, d = {q.shape[3]} and k dividing "
                         f"h = {q.shape[2]}; got shape {tuple(k.shape)}")
    h = q.shape[2]
    r = _check_layer_params(params, h, q.shape[3])
    kh = jnp.repeat(k.astype(jnp.float32), h // k.shape[2], axis=2)  # [b, s, h, d]
    a = jnp.einsum("bthd,hdr->bhtr", q.astype(jnp.float32), params["u_q"])
    bk = jnp.einsum("bshd,hdr->bhsr", kh, params["u_k"])
    delta = jnp.einsum("bhtr,bhsr->bhts", a, bk) / math.sqrt(r)
    return query_gate(q, params)[..., None] * delta


def calibrated_attention(q: jax.Array, k: jax.Array, v: jax.Array, params: Mapping[str, jax.Array], *,
                         causal: bool = True) -> jax.Array:
    """O~ = softmax(Q K^T / sqrt(d) + Diag(g) Delta) V (eqs. 5-9) for one layer: [b, t, h, d]."""
    return attn_lib.attention(q, k, v, causal=causal, bias=calibration_bias(q, k, params))


def make_attention_bias(params: Mapping[str, jax.Array]) -> Callable[[int, jax.Array, jax.Array], jax.Array]:
    """The `attention_bias(layer, q, k)` hook of `models.Transformer` for an adapter of every layer."""
    missing = [name for name in ADAPTER_KEYS if name not in params]
    if missing:
        raise ValueError(f"params must hold {list(ADAPTER_KEYS)}; missing {missing}")

    def bias(layer: int, q: jax.Array, k: jax.Array) -> jax.Array:
        return calibration_bias(q, k, layer_params(params, layer))

    return bias


class Forward(NamedTuple):
    """Student / teacher forward: logits [b, t, v] and hidden states [L, b, t, D] (residual after each block)."""

    logits: jax.Array
    hidden: jax.Array


def forward(model: nnx.Module, tokens: jax.Array, params: Mapping[str, jax.Array] | None = None) -> Forward:
    """Runs the LM on `tokens` [b, t] with an adapter: calibration (`ADAPTER_KEYS`), additive ({"shift"})
    or none (None = the base model). Returns `Forward(logits, hidden)`."""
    kwargs: dict[str, Any] = {}
    if params is not None:
        if "shift" in params:
            kwargs["head_deltas"] = params["shift"]
        else:
            kwargs["attention_bias"] = make_attention_bias(params)
    out = model(tokens, return_intermediates=True, **kwargs)
    return Forward(out.logits, out.intermediates["residuals"][1:])


def teacher_hidden_states(model: nnx.Module, tokens: jax.Array, num_query_tokens: int) -> jax.Array:
    """The teacher's anchors: hidden states [L, b, t_q, D] at the last `num_query_tokens` positions of
    `tokens` [b, t] (demonstrations followed by the query), with the base model (no adapter)."""
    if not 1 <= num_query_tokens <= tokens.shape[1]:
        raise ValueError(f"num_query_tokens must be in [1, {tokens.shape[1]}]; got {num_query_tokens}")
    hidden = forward(model, tokens).hidden
    return jax.lax.stop_gradient(hidden[:, :, -num_query_tokens:])


def hyperbolic_anchor_loss(student: jax.Array, teacher: jax.Array, *, curvature: float = 0.1) -> jax.Array:
    """L_H-anchor of eq. (16): student / teacher hidden states [L, b, t, D] -> scalar (kappa = curvature)."""
    c = _check_curvature(curvature)
    _check_hidden(student, teacher)
    return hyperbolic.anchor_loss(student, teacher, curvature=c)


def euclidean_anchor_loss(student: jax.Array, teacher: jax.Array) -> jax.Array:
    """L_L2-anchor ([INFER] form): the layer and token mean of |LN h - LN h'|^2 over [L, b, t, D]."""
    _check_hidden(student, teacher)
    diff = hyperbolic.layer_norm(student.astype(jnp.float32)) - hyperbolic.layer_norm(teacher.astype(jnp.float32))
    return jnp.mean(jnp.sum(diff * diff, axis=-1))


def _check_hidden(student, teacher) -> None:
    if student.ndim != 4 or tuple(student.shape) != tuple(teacher.shape):
        raise ValueError(f"student and teacher hidden states must both be [L, b, t, D] of one shape; "
                         f"got student {tuple(student.shape)}, teacher {tuple(teacher.shape)}")


def supervised_loss(logits: jax.Array, answers: jax.Array) -> jax.Array:
    """L_sup: mean cross-entropy of `answers` [b] under the last position's logits of `logits` [b, t, v]."""
    if answers.shape != logits.shape[:1]:
        raise ValueError(f"answers must be [b] = [{logits.shape[0]}]; got {tuple(answers.shape)}")
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits[:, -1].astype(jnp.float32), answers))


def method_loss(method: str, student: Forward, teacher_hidden: jax.Array, answers: jax.Array, *,
                curvature: float = 0.1, sup_weight: float = 0.5) -> tuple[jax.Array, dict]:
    """The training loss of `method` (see `METHODS`) and its parts.

    Args:
      method: one of `METHODS`.
      student: the student's `Forward` on its tokens [b, t] (t >= t_q, e.g. a BOS before the query).
      teacher_hidden: [L, b, t_q, D] anchors (`teacher_hidden_states`), aligned with the student's last
        t_q positions.
      answers: [b] answer token ids (predicted at the last query position).
      curvature: kappa > 0 of the hyperbolic anchor.
      sup_weight: lambda of eq. (17).

    Returns:
      (loss, {"sup": L_sup, "anchor": the anchor term (0 for "sup")}).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    sup = supervised_loss(student.logits, answers)
    if method == "sup":
        return sup, {"sup": sup, "anchor": jnp.zeros(())}
    tq = teacher_hidden.shape[2] if teacher_hidden.ndim == 4 else -1
    if not 1 <= tq <= student.hidden.shape[2]:
        raise ValueError(f"teacher_hidden must be [L, b, t_q, D] with 1 <= t_q <= the student's "
                         f"{student.hidden.shape[2]} tokens; got {tuple(teacher_hidden.shape)}")
    hidden = student.hidden[:, :, -tq:]  # aligned on the last t_q (query) positions
    if method == "l2_anchor":
        anchor = euclidean_anchor_loss(hidden, teacher_hidden)
    else:
        anchor = hyperbolic_anchor_loss(hidden, teacher_hidden, curvature=curvature)
    return anchor + sup_weight * sup, {"sup": sup, "anchor": anchor}


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Adapter training settings (spec defaults).

    Attributes:
      method: one of `METHODS`.
      rank: r >= 1.
      curvature: kappa > 0.
      sup_weight: lambda of eq. (17).
      learning_rate: AdamW peak learning rate.
      warmup_fraction: share of the steps with linear warm-up (then cosine decay to 0).
      weight_decay: AdamW decoupled weight decay (matrices only) [INFER].
      num_steps, batch_size: optimizer steps and queries per step.
      seed: adapter init and batch order.
      progress: tqdm bar.
    """

    method: str = "h_anchor"
    rank: int = 4
    curvature: float = 0.1
    sup_weight: float = 0.5
    learning_rate: float = 5e-3
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    num_steps: int = 200
    batch_size: int = 32
    seed: int = 0
    progress: bool = True

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}; got {self.method!r}")
        _check_rank(self.rank)
        _check_curvature(self.curvature)
        for name in ("num_steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}")
        if not 0 <= self.warmup_fraction < 1:
            raise ValueError(f"warmup_fraction must be in [0, 1); got {self.warmup_fraction}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0; got {self.learning_rate}")
        if self.sup_weight < 0:
            raise ValueError(f"sup_weight must be >= 0; got {self.sup_weight}")


class TrainResult(NamedTuple):
    """`train`'s output: the trained adapter parameters and the logged losses (one dict per step)."""

    params: dict
    history: list


def init_params(model: nnx.Module, config: TrainConfig) -> dict:
    """The method's initial adapter parameters for `model` (identity at init)."""
    c = model.config
    if config.method == "additive":
        return init_additive(num_layers=c.num_layers, num_heads=c.num_heads, head_dim=c.resolved_head_dim)
    return init_adapter(jax.random.key(config.seed), num_layers=c.num_layers, num_heads=c.num_heads,
                        head_dim=c.resolved_head_dim, rank=config.rank)


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
    """AdamW with linear warm-up over `warmup_fraction` of the steps, then cosine decay to 0; clip at 1."""
    warmup = int(round(config.warmup_fraction * config.num_steps))
    schedule = optax.warmup_cosine_decay_schedule(0.0, config.learning_rate, warmup_steps=warmup,
                                                  decay_steps=max(config.num_steps, warmup + 1), end_value=0.0)
    adamw = optax.adamw(schedule, weight_decay=config.weight_decay,
                        mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p))
    return optax.chain(optax.clip_by_global_norm(1.0), adamw)


_STEPS: dict = {}  # (id(model), config less seed/progress) -> (model, step, optimizer): one compile per setting


def make_step(model: nnx.Module, config: TrainConfig):
    """A jitted `(params, opt_state, tokens, teacher_hidden, answers) -> (params, opt_state, metrics)`.

    Only the adapter parameters are differentiated and updated; the base LM enters as a constant (its
    current parameters are read at each call). Steps are reused across seeds of one setting.
    """
    key = (id(model), dataclasses.replace(config, seed=0, progress=False))
    if key in _STEPS and _STEPS[key][0] is model:
        step, optimizer = _STEPS[key][1:]
    else:
        step, optimizer = _make_step(model, config)
        if len(_STEPS) > 64:
            _STEPS.clear()
        _STEPS[key] = (model, step, optimizer)
    return (lambda params, opt_state, tokens, teacher_hidden, answers:
            step(params, opt_state, nnx.state(model), tokens, teacher_hidden, answers)), optimizer


def _make_step(model: nnx.Module, config: TrainConfig):
    graphdef = nnx.graphdef(model)
    optimizer = make_optimizer(config)

    @jax.jit
    def step(params, opt_state, base, tokens, teacher_hidden, answers):
        def loss_of(p):
            m = nnx.merge(graphdef, jax.lax.stop_gradient(base))
            out = forward(m, tokens, p)
            return method_loss(config.method, out, teacher_hidden, answers, curvature=config.curvature,
                               sup_weight=config.sup_weight)

        (loss, parts), grads = jax.value_and_grad(loss_of, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, dict(parts, loss=loss)

    return step, optimizer


def train(model: nnx.Module, tokens: np.ndarray, teacher_hidden: np.ndarray, answers: np.ndarray,
          config: TrainConfig, *, desc: str = "hyper_icl") -> TrainResult:
    """Trains an adapter of `config.method` on a frozen `model`.

    Args:
      model: the frozen base LM (`models.Transformer`); its parameters are not changed.
      tokens: [n, t] the student's demonstration-free inputs.
      teacher_hidden: [L, n, t_q, D] the teacher's anchors at the student's last t_q tokens
        (`teacher_hidden_states`).
      answers: [n] answer ids (predicted at the last query position).
      config: `TrainConfig`.
      desc: progress bar label.

    Returns:
      TrainResult(params, history of {"loss", "sup", "anchor"} per step).
    """
    tokens, answers = np.asarray(tokens), np.asarray(answers)
    teacher_hidden = np.asarray(teacher_hidden)
    n = tokens.shape[0]
    if tokens.ndim != 2 or n < 1:
        raise ValueError(f"tokens must be [n, t] with n >= 1; got shape {tokens.shape}")
    c = model.config
    th = teacher_hidden.shape
    if len(th) != 4 or (th[0], th[1], th[3]) != (c.num_layers, n, c.d_model) or not 1 <= th[2] <= tokens.shape[1]:
        raise ValueError(f"teacher_hidden must be [L, n, t_q, D] = [{c.num_layers}, {n}, t_q <= {tokens.shape[1]}, "
                         f"{c.d_model}]; got {th}")
    if answers.shape != (n,):
        raise ValueError(f"answers must be [n] = [{n}]; got {answers.shape}")
    params = init_params(model, config)
    step, optimizer = make_step(model, config)
    opt_state = optimizer.init(params)
    rng = np.random.default_rng(config.seed)
    history = []
    bs = min(config.batch_size, n)
    for _ in tqdm(range(config.num_steps), desc=desc, disable=not config.progress, leave=False):
        idx = rng.choice(n, bs, replace=False)
        params, opt_state, metrics = step(params, opt_state, jnp.asarray(tokens[idx]),
                                          jnp.asarray(teacher_hidden[:, idx]), jnp.asarray(answers[idx]))
        history.append({key: float(v) for key, v in metrics.items()})
    return TrainResult(params, history)


def adapter_param_count(params: Mapping[str, jax.Array]) -> int:
    """Number of trainable adapter parameters."""
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


def forward_flops(config, seq_len: int, *, rank: int = 0, answer_positions: int = 1) -> float:
    """Modeled forward FLOPs of one prompt of `seq_len` tokens through a `TransformerConfig`.

    2 FLOPs per multiply-add of the Q/K/V/O and FFN matmuls per token, the causal attention scores and
    values (4 h d per (query, key<=query) pair), the unembedding at `answer_positions` positions, and,
    with rank > 0, the calibration per layer: A and B (2 h d r per token each), Delta (2 h r per pair)
    and the gate (about 10 h d per token).
    """
    D, d, h, k = config.d_model, config.resolved_head_dim, config.num_heads, config.num_kv_heads
    t = int(seq_len)
    pairs = t * (t + 1) / 2
    per_layer = 2 * t * (D * d * (2 * h + 2 * k) + config._ffn_weights(active=True)) + 4 * h * d * pairs
    if rank:
        per_layer += 4 * t * h * d * rank + 2 * h * rank * t * t + 10 * t * h * d
    return float(config.num_layers * per_layer + 2 * D * config.vocab_size * answer_positions)
