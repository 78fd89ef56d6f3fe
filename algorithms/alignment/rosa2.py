"""ROSA2: words-and-weights co-adaptation over a multi-turn interaction (test-time policy adaptation).

Spec: ``papers/specs/rl_alignment_agents.md`` section 5 (Wei et al., "Words & Weights: Streamlining
Multi-Turn Interactions via Co-Adaptation", arXiv:2603.01375; its weight stream is ROSA, arXiv:2509.23166).

A user poses a task; after each model answer the user gives feedback ("wrong", "closer", a hint). Two
streams adapt the model within the conversation:

  * words (the feedback normaliser, `normalize_feedback`): turns the raw feedback into a clarified
    instruction. In our synthetic world the instruction is one of K intent tokens; the normaliser keeps a
    belief over the K intents, updates it by Bayes' rule from the feedback (an answer judged wrong rules
    out every intent whose output it equals; "closer"/"wrong" favour the intents under which the answer
    moved closer / did not; a hint names an intent, possibly wrongly) and writes the most probable
    intent as the next instruction.
  * weights (ROSA, `rosa_step`): the failure feedback is a scalar reward r on the sampled answer y_k; the
    KL-regularised objective max_pi E[r] - beta KL(pi || pi_k) has the optimum
    pi*(y) ∝ pi_k(y) exp(r(y) / beta) (`kl_regularized_optimum`). ROSA takes one linearised step of a small
    adapter subset of the parameters toward pi*: the gradient of E_{pi*}[log pi_theta] (= -KL(pi* || pi_theta)
    + const) at theta_k, which for a reward on y_k alone is exactly
    c * grad log pi(y_k), c = p (e^{r/beta} - 1) / (1 + p (e^{r/beta} - 1)), p = pi_k(y_k)
    (`reweight_coefficient`), preconditioned by the Fisher matrix of the token distributions along the
    trajectory (damped; solved by `conjugate_gradient` from Fisher-vector products, no explicit matrix).
  * ROSA2 (joint): words first, then the ROSA step on the *clarified* trajectory (c_{k+1}, y_k); when the
    new instruction already makes y_k unlikely, p is small and the weight step is small (semantic
    pre-conditioning reduces the parameter shift).

`co_adapt` runs the whole per-turn loop over a batch of conversations for one arm (static, words-only,
weights-only, ROSA2), with the adapter a residual-stream offset [L, D] of `models.Transformer`
(``residual_deltas``), reset per conversation, and orbax checkpoints after every turn (a resumed run ends
with the same adapters as an uninterrupted one).

INFERRED (the spec marks the update equations low-confidence and the paper's code was not readable):
  * the closed-form reweighted gradient above (our derivation for a reward on the sampled answer only);
  * the Fisher: per-position token Fisher (softmax Gauss-Newton) along the teacher-forced answer, plus
    damping lambda I standing in for the KL regulariser; step = eta F^{-1} g, optionally capped to a
    quadratic-model KL of ``max_kl`` (trust region);
  * the words stream: a rule-based Bayesian normaliser over a known finite intent set (a stand-in for
    the paper's LLM critic / textual gradient); its assumed noise rates are arguments;
  * the adapter: one residual offset per layer (ROSA's ablations include hidden-state offsets; the
    spec's LoRA default is not used), reset per conversation; the LM sees only the current
    instruction (no dialogue history in context); answers are greedy.

Dimension legend: `n` conversations, `K` intents, `m` answer tokens, `p` prompt tokens, `t` tokens,
`v` vocabulary, `L` layers, `D` model width.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
from flax import nnx
from tqdm.auto import tqdm

from algorithms.training import Checkpointer

__all__ = [
    "CORRECT", "WRONG", "CLOSER", "HINT", "FEEDBACK_KINDS", "ARMS",
    "ROSAConfig", "CGResult", "kl_regularized_optimum", "kl_objective", "conjugate_gradient",
    "reweight_coefficient", "answer_logprob", "fisher_vector_product", "rosa_step", "normalize_feedback",
    "transformer_logits_fn", "greedy_answers", "InteractionState", "co_adapt",
]

# Feedback kinds (a user's reply to an answer).
CORRECT, WRONG, CLOSER, HINT = 0, 1, 2, 3
FEEDBACK_KINDS = ("correct", "wrong", "closer", "hint")
# Arm name -> (words stream on, weights stream on).
ARMS = {"static": (False, False), "words": (True, False), "weights": (False, True), "rosa2": (True, True)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ROSAConfig:
    """Settings of the ROSA weight step.

    Attributes:
      beta: KL temperature of the reweighted target pi* ∝ pi exp(r / beta).
      damping: lambda of (F + lambda I) (the KL regulariser's stand-in; keeps the system SPD).
      cg_iters: conjugate-gradient iterations.
      cg_tol: CG stops when ||residual|| <= cg_tol * ||g||.
      step_size: eta, the step along the solved direction.
      max_kl: if set, the step is shrunk so that 0.5 * step^T F step <= max_kl.
      reward_wrong / reward_closer / reward_hint: the scalar reward of each failure feedback.
    """

    beta: float = 0.5
    damping: float = 1e-2
    cg_iters: int = 10
    cg_tol: float = 1e-6
    step_size: float = 1.0
    max_kl: float | None = None
    reward_wrong: float = -1.0
    reward_closer: float = -0.5
    reward_hint: float = -1.0

    def __post_init__(self):
        for name in ("beta", "damping", "step_size"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v > 0):
                raise ValueError(f"{name} must be > 0; got {v!r}")
        if not (isinstance(self.cg_iters, int) and self.cg_iters >= 1):
            raise ValueError(f"cg_iters must be an int >= 1; got {self.cg_iters!r}")
        if not self.cg_tol >= 0:
            raise ValueError(f"cg_tol must be >= 0; got {self.cg_tol!r}")
        if self.max_kl is not None and not self.max_kl > 0:
            raise ValueError(f"max_kl must be None or > 0; got {self.max_kl!r}")

    def rewards(self) -> jax.Array:
        """[4] the reward per feedback kind (CORRECT gets 0: no update on success)."""
        return jnp.array([0.0, self.reward_wrong, self.reward_closer, self.reward_hint], jnp.float32)


# --- the KL-regularised optimum ------------------------------------------------------------------------


def kl_regularized_optimum(p: jax.Array, r: jax.Array, beta: float) -> jax.Array:
    """The maximiser of E_q[r] - beta KL(q || p) over distributions q: q = p exp(r / beta) / Z.

    Args:
      p: [..., n] a categorical distribution (rows sum to 1, entries >= 0).
      r: [..., n] rewards (broadcast against p).
      beta: > 0.

    Returns:
      [..., n] the optimum (computed in log space; zero where p is zero).
    """
    if not beta > 0:
        raise ValueError(f"beta must be > 0; got {beta!r}")
    p = jnp.asarray(p, jnp.float32)
    logits = jnp.where(p > 0, jnp.log(jnp.where(p > 0, p, 1.0)) + jnp.asarray(r, jnp.float32) / beta, -jnp.inf)
    return jax.nn.softmax(logits, axis=-1)


def kl_objective(q: jax.Array, p: jax.Array, r: jax.Array, beta: float) -> jax.Array:
    """E_q[r] - beta KL(q || p) over the last axis ([..., n] -> [...])."""
    q, p = jnp.asarray(q, jnp.float32), jnp.asarray(p, jnp.float32)
    safe_q = jnp.where(q > 0, q, 1.0)
    kl = jnp.sum(jnp.where(q > 0, q * (jnp.log(safe_q) - jnp.log(jnp.where(q > 0, p, 1.0))), 0.0), axis=-1)
    return jnp.sum(q * r, axis=-1) - beta * kl


# --- conjugate gradient ---------------------------------------------------------------------------


class CGResult(NamedTuple):
    """Output of `conjugate_gradient`: the solution (a pytree like b), ||b - A x|| and the iterations run."""

    x: Any
    residual_norm: jax.Array
    iterations: jax.Array


def _vdot(a, b) -> jax.Array:
    return sum(jnp.vdot(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def conjugate_gradient(matvec: Callable[[Any], Any], b: Any, *, max_iters: int, tol: float = 1e-6) -> CGResult:
    """Solves A x = b for a symmetric positive definite A given only as ``matvec`` (Hestenes-Stiefel CG).

    Args:
      matvec: x -> A x on pytrees shaped like ``b``.
      b: the right-hand side (a pytree of arrays).
      max_iters: at most this many iterations (n iterations solve an n-dimensional system exactly in
        exact arithmetic).
      tol: stop when ||r|| <= tol * ||b|| (relative residual); b = 0 returns x = 0 at once.

    Returns:
      CGResult(x, ||b - A x|| as tracked by the recursion, iterations).
    """
    if not (isinstance(max_iters, int) and max_iters >= 1):
        raise ValueError(f"max_iters must be an int >= 1; got {max_iters!r}")
    x0 = jax.tree.map(jnp.zeros_like, b)
    rr0 = _vdot(b, b)
    stop = (tol ** 2) * rr0

    def cond(carry):
        _, _, _, rr, k = carry
        return (k < max_iters) & (rr > stop) & (rr > 0)

    def body(carry):
        x, r, d, rr, k = carry
        Ad = matvec(d)
        dad = _vdot(d, Ad)
        alpha = jnp.where(dad > 0, rr / jnp.where(dad > 0, dad, 1.0), 0.0)
        x = jax.tree.map(lambda a, b_: a + alpha * b_, x, d)
        r = jax.tree.map(lambda a, b_: a - alpha * b_, r, Ad)
        rr_new = _vdot(r, r)
        d = jax.tree.map(lambda a, b_: a + (rr_new / rr) * b_, r, d)
        # A non-positive curvature d^T A d (A not SPD numerically) ends the recursion at the current x.
        return x, r, d, jnp.where(dad > 0, rr_new, 0.0), k + 1

    x, _, _, rr, k = jax.lax.while_loop(cond, body, (x0, b, b, rr0, jnp.zeros((), jnp.int32)))
    return CGResult(x, jnp.sqrt(rr), k)


# --- the ROSA weight step ----------------------------------------------------------------------------


def reweight_coefficient(logp_y: jax.Array, reward: jax.Array, beta: float) -> jax.Array:
    """c with grad_theta E_{pi*}[log pi_theta] = c * grad log pi_theta(y_k) at theta_k, for a reward on y_k only.

    pi* = pi_k reweighted by exp(r 1[y = y_k] / beta); with p = pi_k(y_k) and a = e^{r/beta} - 1,
    c = p a / (1 + p a). c = 0 when r = 0; c < 0 (push y_k down) when r < 0.
    """
    p = jnp.exp(jnp.minimum(logp_y, 0.0))
    a = jnp.expm1(jnp.asarray(reward, jnp.float32) / beta)
    return p * a / (1.0 + p * a)


def answer_logprob(logits: jax.Array, tokens: jax.Array, mask: jax.Array) -> jax.Array:
    """sum_j mask[j] log pi(tokens[j] | tokens[:j]) for one sequence.

    Args:
      logits: [t, v] next-token logits (row j predicts tokens[j + 1]).
      tokens: [t] int ids.
      mask: [t] 1 on the scored (answer) tokens; mask[0] must be 0 (nothing predicts the first token).
    """
    logp = jax.nn.log_softmax(logits[:-1].astype(jnp.float32), axis=-1)
    tok = jnp.take_along_axis(logp, tokens[1:, None].astype(jnp.int32), axis=-1)[:, 0]
    return jnp.sum(tok * mask[1:].astype(jnp.float32))


def fisher_vector_product(logits_of: Callable[[Any], jax.Array], adapter: Any, mask: jax.Array, v: Any) -> Any:
    """F v with F = sum_j mask[j+1] J_j^T (diag(p_j) - p_j p_j^T) J_j, J_j = d logits[j] / d adapter.

    The Fisher of the token distributions along the teacher-forced answer (= the Gauss-Newton matrix of
    the softmax cross-entropy), from one jvp and one vjp; F is never formed.

    Args:
      logits_of: adapter -> [t, v] logits.
      adapter: the point (a pytree).
      mask: [t] answer mask (as in `answer_logprob`).
      v: a pytree like ``adapter``.
    """
    z, dz = jax.jvp(logits_of, (adapter,), (v,))
    p = jax.nn.softmax(z[:-1].astype(jnp.float32), axis=-1)
    dz = dz[:-1].astype(jnp.float32)
    hv = (p * dz - p * jnp.sum(p * dz, axis=-1, keepdims=True)) * mask[1:, None].astype(jnp.float32)
    hv = jnp.concatenate([hv, jnp.zeros((1, hv.shape[-1]), hv.dtype)], axis=0).astype(z.dtype)
    _, vjp = jax.vjp(logits_of, adapter)
    return vjp(hv)[0]


def _key_str(path) -> str:
    parts = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return "/".join(parts)


def rosa_step(logits_fn: Callable[[Any, jax.Array], jax.Array], params: Any, tokens: jax.Array, mask: jax.Array,
              reward: jax.Array, *, is_adapter: Callable[[str], bool], config: ROSAConfig = ROSAConfig()):
    """One ROSA step of the adapter subset of ``params`` toward the reweighted policy (one sequence).

    Args:
      logits_fn: (params, tokens [t]) -> logits [t, v].
      params: the parameter pytree; only the leaves whose "/"-joined key path satisfies ``is_adapter`` move.
      tokens: [t] the (clarified) context followed by the sampled answer y_k.
      mask: [t] 1 on y_k's tokens.
      reward: scalar r of y_k (0: no update).
      is_adapter: path -> whether that leaf is an adapter parameter.
      config: `ROSAConfig`.

    Returns:
      (new params — every non-adapter leaf is the same object as in ``params`` —, info dict with
      ``coef`` (c), ``logp`` (log pi(y_k)), ``step_norm`` (||Delta||), ``cg_residual``, ``kl_model``
      (0.5 Delta^T F Delta)).
    """
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    sel = [bool(is_adapter(_key_str(path))) for path, _ in flat]
    if not any(sel):
        raise ValueError("is_adapter selects no leaf of params; paths are "
                         f"{[_key_str(p) for p, _ in flat][:8]}...")
    leaves = [leaf for _, leaf in flat]
    adapter = [leaf for leaf, s in zip(leaves, sel) if s]

    def full(ad):
        it = iter(ad)
        return jax.tree_util.tree_unflatten(treedef, [next(it) if s else leaf for leaf, s in zip(leaves, sel)])

    def logits_of(ad):
        return logits_fn(full(ad), tokens)

    def logp_of(ad):
        return answer_logprob(logits_of(ad), tokens, mask)

    logp, grad = jax.value_and_grad(logp_of)(adapter)
    coef = reweight_coefficient(logp, reward, config.beta)
    g = jax.tree.map(lambda x: coef * x, grad)

    def matvec(v):
        fv = fisher_vector_product(logits_of, adapter, mask, v)
        return jax.tree.map(lambda a, b: a + config.damping * b, fv, v)

    # Solve for the unit right-hand side and rescale (a tiny g, e.g. when the clarified instruction already
    # makes y_k unlikely, would otherwise underflow inside CG).
    g_norm = jnp.sqrt(_vdot(g, g))
    unit = jax.tree.map(lambda x: x / jnp.where(g_norm > 0, g_norm, 1.0), g)
    cg = conjugate_gradient(matvec, unit, max_iters=config.cg_iters, tol=config.cg_tol)
    delta = jax.tree.map(lambda x: config.step_size * g_norm * x, cg.x)
    quad = 0.5 * _vdot(delta, fisher_vector_product(logits_of, adapter, mask, delta))
    if config.max_kl is not None:
        shrink = jnp.minimum(1.0, jnp.sqrt(config.max_kl / jnp.maximum(quad, 1e-30)))
        delta = jax.tree.map(lambda x: shrink * x, delta)
        quad = quad * shrink ** 2
    new_adapter = [a + d.astype(a.dtype) for a, d in zip(adapter, delta)]
    it = iter(new_adapter)
    out = jax.tree_util.tree_unflatten(treedef, [next(it) if s else leaf for leaf, s in zip(leaves, sel)])
    info = {"coef": coef, "logp": logp, "step_norm": jnp.sqrt(_vdot(delta, delta)),
            "cg_residual": g_norm * cg.residual_norm, "kl_model": quad}
    return out, info


# --- the words stream: a rule-based feedback normaliser -------------------------------------------------


def normalize_feedback(belief: jax.Array, candidates: jax.Array, answers: jax.Array, prev_cand_match: jax.Array,
                       kind: jax.Array, hint: jax.Array, *, closer_noise: float, hint_noise: float):
    """Bayes update of the belief over K intents from one turn's feedback; returns the clarified intent.

    Likelihood of the feedback under intent i (the normaliser's model of the user):
      * any failure (WRONG / CLOSER / HINT): 0 if the answer equals intent i's output (the user would
        have said "correct"), else 1;
      * CLOSER: 1 - closer_noise if the answer matches intent i's output at more positions than the
        previous answer did (prev_cand_match), else closer_noise; WRONG: the complement;
      * HINT naming j: 1 - hint_noise if i = j, else hint_noise / (K - 1).
    CORRECT leaves the belief unchanged. An all-zero posterior falls back to the prior row.

    Args:
      belief: [n, K] current probabilities.
      candidates: [n, K, m] each intent's correct answer.
      answers: [n, m] the model's answers.
      prev_cand_match: [n, K] matches of the previous answer with each candidate (0 before the first).
      kind: [n] feedback kinds (CORRECT, WRONG, CLOSER, HINT).
      hint: [n] the intent a HINT names (ignored otherwise).
      closer_noise, hint_noise: the assumed noise rates in [0, 1).

    Returns:
      (new belief [n, K], clarified intent [n] = argmax, matches of this answer with each candidate [n, K]).
    """
    n, K = belief.shape
    if candidates.shape[:2] != (n, K) or candidates.shape[2:] != answers.shape[1:] or answers.shape[0] != n:
        raise ValueError(f"candidates must be [n={n}, K={K}, m] and answers [n, m]; got {candidates.shape} "
                         f"and {answers.shape}")
    match = jnp.sum(candidates == answers[:, None, :], axis=-1).astype(jnp.int32)  # [n, K]
    exact = match == candidates.shape[-1]
    failed = kind != CORRECT
    lik = jnp.where(failed[:, None] & exact, 0.0, 1.0)
    closer = match > prev_cand_match
    lik_closer = jnp.where(closer, 1.0 - closer_noise, closer_noise)
    lik = lik * jnp.where((kind == CLOSER)[:, None], lik_closer, 1.0)
    lik_wrong = jnp.where(closer, closer_noise, 1.0 - closer_noise)
    lik = lik * jnp.where((kind == WRONG)[:, None], lik_wrong, 1.0)
    named = jnp.arange(K)[None, :] == hint[:, None]
    lik_hint = jnp.where(named, 1.0 - hint_noise, hint_noise / max(K - 1, 1))
    lik = lik * jnp.where((kind == HINT)[:, None], lik_hint, 1.0)
    post = belief * lik
    z = post.sum(-1, keepdims=True)
    post = jnp.where(z > 0, post / jnp.where(z > 0, z, 1.0), belief)
    return post, jnp.argmax(post, axis=-1).astype(jnp.int32), match


# --- the LM side: logits, greedy answers ------------------------------------------------------------------


def transformer_logits_fn(graphdef: nnx.GraphDef) -> Callable[[Any, jax.Array], jax.Array]:
    """(params {"model": model params, "adapter": [L, D]}, tokens [t]) -> logits [t, v] of `models.Transformer`,
    the adapter added to the residual stream after every block (``residual_deltas``)."""

    def logits_fn(params, tokens):
        model = nnx.merge(graphdef, params["model"])
        return model(tokens[None], residual_deltas=params["adapter"]).logits[0]

    return logits_fn


def is_residual_adapter(path: str) -> bool:
    """The adapter predicate of `transformer_logits_fn`'s parameter layout."""
    return path.split("/")[0] == "adapter"


@functools.partial(jax.jit, static_argnums=(0, 4))
def _greedy(graphdef, model_params, adapters, prompts, answer_len):
    n, p = prompts.shape
    tokens = jnp.concatenate([prompts, jnp.zeros((n, answer_len), prompts.dtype)], axis=1)
    model = nnx.merge(graphdef, model_params)
    deltas = jnp.swapaxes(adapters, 0, 1)  # [L, n, D]

    def body(j, toks):
        logits = model(toks, residual_deltas=deltas, logits_at=jnp.full((n, 1), p - 1 + j)).logits[:, 0]
        return toks.at[:, p + j].set(jnp.argmax(logits, -1).astype(toks.dtype))

    return jax.lax.fori_loop(0, answer_len, body, tokens)[:, p:]


def greedy_answers(graphdef: nnx.GraphDef, model_params: Any, adapters: jax.Array, prompts: jax.Array,
                   answer_len: int) -> jax.Array:
    """Greedy answers [n, m] of the LM with per-conversation residual adapters [n, L, D] after prompts [n, p]
    (full recomputation per token; answers are short)."""
    prompts = jnp.asarray(prompts, jnp.int32)
    if prompts.ndim != 2 or adapters.ndim != 3 or adapters.shape[0] != prompts.shape[0]:
        raise ValueError(f"prompts must be [n, p] and adapters [n, L, D]; got {prompts.shape} and {adapters.shape}")
    return _greedy(graphdef, model_params, adapters, prompts, int(answer_len))


# --- the multi-turn driver ----------------------------------------------------------------------------------


class InteractionState(NamedTuple):
    """Everything a turn updates (a pytree of arrays; checkpointed after every turn).

    Attributes:
      turn: () int32 turns done.
      adapter: [n, L, D] per-conversation residual adapters.
      belief: [n, K] the normaliser's belief over intents.
      prev_cand_match: [n, K] matches of the last answer with each intent's output.
      prev_match: [n] matches of the last answer with the user's target (the user's memory).
      instruction: [n] int32 the current instruction (-1 = the initial, ambiguous one).
      solved_at: [n] int32 turn (1-based) of the first correct answer; 0 = not yet.
      shift: [n] float32 accumulated ||Delta theta||.
    """

    turn: jax.Array
    adapter: jax.Array
    belief: jax.Array
    prev_cand_match: jax.Array
    prev_match: jax.Array
    instruction: jax.Array
    solved_at: jax.Array
    shift: jax.Array


@functools.lru_cache(maxsize=16)
def _rosa_batch(graphdef, config: ROSAConfig):
    logits_fn = transformer_logits_fn(graphdef)

    def one(model_params, adapter, tokens, mask, reward):
        new, info = rosa_step(logits_fn, {"model": model_params, "adapter": adapter}, tokens, mask, reward,
                              is_adapter=is_residual_adapter, config=config)
        return new["adapter"], info["step_norm"]

    return jax.jit(jax.vmap(one, in_axes=(None, 0, 0, 0, 0)))


def co_adapt(*, graphdef: nnx.GraphDef, model_params: Any, prompt_fn: Callable[[np.ndarray], np.ndarray],
             user_fn: Callable[[int, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]],
             candidates: np.ndarray, prior: np.ndarray, num_turns: int, arm: str,
             initial_instruction: np.ndarray | None = None,
             config: ROSAConfig = ROSAConfig(), closer_noise: float = 0.1, hint_noise: float = 0.2,
             workdir: str | os.PathLike | None = None, stop_after: int | None = None, progress: bool = True,
             desc: str = "rosa2", fingerprint: str = "") -> InteractionState:
    """Runs ``num_turns`` turns of n conversations for one arm of `ARMS`, resuming from ``workdir``.

    Per turn k: the LM answers greedily the prompt of the current instruction (with its adapter); the user
    replies (``user_fn(k, answers, prev_match) -> (kind [n], hint [n], match [n])``, deterministic in k);
    solved conversations stop; for the failing ones the words stream (if on) normalises the feedback into
    a new instruction, then the weights stream (if on) takes one ROSA step on (prompt of the new
    instruction, answer) with the reward of the feedback kind.

    Args:
      graphdef, model_params: the trained LM (`nnx.split`); its parameters never change.
      prompt_fn: instruction [n] (-1 = ambiguous) -> prompt tokens [n, p].
      user_fn: the simulated user, see above.
      candidates: [n, K, m] every intent's correct answer (what the normaliser knows of the task family).
      prior: [n, K] the normaliser's prior over intents (the intents the initial instruction fits).
      num_turns: T.
      arm: a key of `ARMS`.
      initial_instruction: [n] the users' first instructions (-1 = ambiguous; None = all ambiguous).
      config: the ROSA step.
      closer_noise, hint_noise: the normaliser's assumed noise rates.
      workdir: checkpoints after every turn (None: none).
      stop_after: stop (as if interrupted) once this many turns are done.
      progress, desc: tqdm bar.
      fingerprint: saved with the checkpoints; resuming with a different one raises ValueError.

    Returns:
      the final `InteractionState`.
    """
    if arm not in ARMS:
        raise ValueError(f"arm must be one of {list(ARMS)}; got {arm!r}")
    if not (isinstance(num_turns, int) and num_turns >= 1):
        raise ValueError(f"num_turns must be an int >= 1; got {num_turns!r}")
    words, weights = ARMS[arm]
    candidates = np.asarray(candidates)
    prior = np.asarray(prior, np.float32)
    n, K, m = candidates.shape
    if prior.shape != (n, K):
        raise ValueError(f"prior must be [n={n}, K={K}]; got {prior.shape}")
    if initial_instruction is None:
        initial_instruction = np.full((n,), -1, np.int32)
    initial_instruction = np.asarray(initial_instruction, np.int32)
    if initial_instruction.shape != (n,):
        raise ValueError(f"initial_instruction must be [n={n}]; got {initial_instruction.shape}")
    cfg = nnx.merge(graphdef, model_params).config
    state = InteractionState(
        turn=jnp.zeros((), jnp.int32), adapter=jnp.zeros((n, cfg.num_layers, cfg.d_model), jnp.float32),
        belief=jnp.asarray(prior), prev_cand_match=jnp.zeros((n, K), jnp.int32),
        prev_match=jnp.zeros((n,), jnp.int32), instruction=jnp.asarray(initial_instruction),
        solved_at=jnp.zeros((n,), jnp.int32), shift=jnp.zeros((n,), jnp.float32))
    ckpt = None
    if workdir is not None:
        ckpt = Checkpointer(epath.Path(workdir), max_to_keep=1)
        if ckpt.latest_step() is not None:
            meta = ckpt.metadata()
            if meta.get("fingerprint") != fingerprint:
                raise ValueError(f"checkpoint in {workdir} is of another run (fingerprint {meta.get('fingerprint')!r}"
                                 f", expected {fingerprint!r})")
            state, _ = ckpt.restore(state)
    rosa = _rosa_batch(graphdef, config) if weights else None
    rewards = np.asarray(config.rewards())
    cand_j = jnp.asarray(candidates)
    start = int(state.turn)
    end = num_turns if stop_after is None else min(num_turns, stop_after)
    try:
        for k in tqdm(range(start, end), desc=desc, disable=not progress, initial=start, total=num_turns):
            prompts = np.asarray(prompt_fn(np.asarray(state.instruction)), np.int32)
            answers = np.asarray(greedy_answers(graphdef, model_params, state.adapter, prompts, m))
            kind, hint, match = (np.asarray(a) for a in user_fn(k, answers, np.asarray(state.prev_match)))
            active = np.asarray(state.solved_at) == 0
            solved = active & (kind == CORRECT)
            failing = active & (kind != CORRECT)
            solved_at = np.where(solved, k + 1, np.asarray(state.solved_at))
            belief, instruction, cand_match = state.belief, state.instruction, state.prev_cand_match
            if words:
                nb, ni, cm = normalize_feedback(state.belief, cand_j, jnp.asarray(answers), state.prev_cand_match,
                                                jnp.asarray(kind), jnp.asarray(hint), closer_noise=closer_noise,
                                                hint_noise=hint_noise)
                f = jnp.asarray(failing)
                belief = jnp.where(f[:, None], nb, state.belief)
                instruction = jnp.where(f, ni, state.instruction)
                cand_match = jnp.where(f[:, None], cm, state.prev_cand_match)
            adapter, shift = state.adapter, state.shift
            if weights:
                clarified = np.asarray(prompt_fn(np.asarray(instruction)), np.int32)
                tokens = np.concatenate([clarified, answers.astype(np.int32)], axis=1)
                mask = np.zeros(tokens.shape, np.float32)
                mask[:, clarified.shape[1]:] = 1.0
                reward = np.where(failing, rewards[kind], 0.0).astype(np.float32)
                new_adapter, norm = rosa(model_params, state.adapter, jnp.asarray(tokens), jnp.asarray(mask),
                                         jnp.asarray(reward))
                f = jnp.asarray(failing)
                adapter = jnp.where(f[:, None, None], new_adapter, state.adapter)
                shift = state.shift + jnp.where(f, norm, 0.0)
            state = InteractionState(
                turn=jnp.asarray(k + 1, jnp.int32), adapter=adapter, belief=belief, prev_cand_match=cand_match,
                prev_match=jnp.where(jnp.asarray(active), jnp.asarray(match, jnp.int32), state.prev_match),
                instruction=instruction, solved_at=jnp.asarray(solved_at, jnp.int32), shift=shift)
            if ckpt is not None:
                ckpt.save(k + 1, state, {"fingerprint": fingerprint, "turn": k + 1})
    finally:
        if ckpt is not None:
            ckpt.close()
    return state
