"""Benchmarks of the library's models, beside the kernel benchmarks: one command, one JSON file.

    python -m experiments bench                                   # every section (kernels + models)
    python -m experiments bench --only decode,generate --out results/bench/cpu.json
    python -m experiments bench --only generate --generate-tokens 2048,32768

Runs the sections of ``pallas_kernels.bench`` (``ops``, ``decode``, ``ffd``; see its docstring) and two
that need the model stack, which ``pallas_kernels`` may not import:

``generate``: decode throughput of ``algorithms.decoding.generate`` on a GQA decoder LM (32 query / 8 KV
heads of 128, D=1024, 2 layers, f=2048, vocab 4096, float32) at 2k-32k cached tokens. The cache is
filled with random keys and values up to the context length (a 32k-token dense prefill does not fit
a CPU: its score matrix alone is 137 GB), a one-token prompt is appended, and ``generate`` runs for
two numbers of new tokens; the time difference over the token difference is the decode time per
token, with compilation and the prompt step excluded. Beside it, the roofline: the bytes one decode
step must read (every layer's K and V up to the context, plus every weight) over the read bandwidth
measured in the same run (a 1 GiB reduction, ``pallas_kernels.bench.read_bandwidth``).

``ffd_generate``: FFD decoding end to end. ``generate`` on the constructed induction LM
(``models.induction``: 2 layers, 2 heads of 128, vocab 16384) over a span-copy prompt (distinct items,
then ``QUERY x``) at 8k and 16k tokens: ms per decode token (two generation lengths after one prefill)
of dense decoding, FFD at ``delta`` with the cache's quantized pages (``KVCache.pages``: each page
quantized once; the CPU fast path) and FFD on a cache without pages (every page quantized at every
step), interleaved; with FFD's kept page fraction per layer on the first decode step, whether the
three generate the same tokens, and their copy accuracy.

``moe``: the MoE FFN (``models.moe.MoEFFN``, top-2 of E=8 and E=32 SwiGLU experts, 2048 tokens, D=256,
f=512): the forward through the grouped matmul (``"xla"``, i.e. ``jax.lax.ragged_dot``, and the
``"xla_tiled"`` per-group padded batched matmul) against every expert on every token combined with the
top-k gate mask (``models.moe.dense_moe_reference``), same inputs and same run, with modeled FLOPs.

Nothing here is asserted: the numbers are printed (and merged into ``--out``) for the reader to judge.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from algorithms.decoding import generate
from experiments.ffd import with_decode
from experiments.tasks.span_copy import SpanCopyTask
from models import MoEConfig, Transformer, TransformerConfig
from models.induction import InductionSpec, fingerprint, induction_lm
from models.moe import MoEFFN, dense_moe_reference
from pallas_kernels import bench as kb
from pallas_kernels.grouped_matmul import cost as gmm_cost_lib

__all__ = ["bench_generate", "bench_moe", "main", "SECTIONS"]

GENERATE_MODEL = dict(vocab_size=4096, d_model=1024, num_layers=2, num_heads=32, num_kv_heads=8, head_dim=128,
                      d_ff=2048)


def _filled_cache(model: Transformer, context: int, room: int, key: jax.Array):
    """A batch-1 cache holding `context` random keys and values per layer, with `room` free slots."""
    cache = model.init_cache(1, context + room)
    keys = jax.random.split(key, 2 * len(cache.keys))
    fill = lambda x, k: jax.random.normal(k, x.shape, x.dtype)
    return cache.replace(keys=tuple(fill(x, k) for x, k in zip(cache.keys, keys[::2])),
                         values=tuple(fill(x, k) for x, k in zip(cache.values, keys[1::2])),
                         lengths=jnp.full((1,), context, jnp.int32))


def bench_generate(contexts=(2048, 8192, 32768), new_tokens=(4, 20), repeats: int = 3, *,
                   model_config: dict | None = None, read_bytes: int = 1 << 30) -> dict:
    """Decode tokens per second of `generate` beside its memory roofline, per context length."""
    model_config = GENERATE_MODEL if model_config is None else model_config
    cfg = TransformerConfig(**model_config)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    weight_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    bandwidth = kb.read_bandwidth(read_bytes)
    n1, n2 = new_tokens
    prompt = jnp.ones((1, 1), jnp.int32)
    rows = []
    for context in contexts:
        cache = _filled_cache(model, context, 1 + n2, jax.random.key(context))
        times = kb._timed({n: (lambda n=n: generate(model, prompt, max_new_tokens=n, cache=cache).tokens)
                           for n in (n1, n2)}, repeats)
        per_token = (times[n2] - times[n1]) / (n2 - n1)
        kv_bytes = cfg.num_layers * 2 * context * cfg.num_kv_heads * cfg.resolved_head_dim * 4
        roofline = (kv_bytes + weight_bytes) / bandwidth
        rows.append({"context": context, "layout": cache.layout, "ms_per_token": per_token * 1e3,
                     "tokens_per_s": 1.0 / per_token, "kv_mbytes": kv_bytes / 1e6,
                     "weight_mbytes": weight_bytes / 1e6, "roofline_ms": roofline * 1e3,
                     "x_roofline": per_token / roofline,
                     "ms_total": {str(n): t * 1e3 for n, t in times.items()}})
        del cache
    return {"model": model_config, "new_tokens": list(new_tokens), "read_bandwidth_gb_s": bandwidth / 1e9,
            "rows": rows}


def _print_generate(res: dict) -> None:
    m = res["model"]
    print(f"\ngenerate decode throughput (GQA {m['num_heads']}/{m['num_kv_heads']} heads of {m['head_dim']}, "
          f"D={m['d_model']}, {m['num_layers']} layers, f={m['d_ff']}, vocab {m['vocab_size']}, float32; "
          f"tokens {res['new_tokens'][0]} vs {res['new_tokens'][1]}; read bandwidth "
          f"{res['read_bandwidth_gb_s']:.1f} GB/s)")
    print(f"{'context':>8}{'layout':>7}{'ms/token':>10}{'tokens/s':>10}{'KV MB':>8}{'weights MB':>11}"
          f"{'roofline ms':>12}{'x roofline':>11}")
    for r in res["rows"]:
        print(f"{r['context']:>8}{r['layout']:>7}{r['ms_per_token']:>10.2f}{r['tokens_per_s']:>10.1f}"
              f"{r['kv_mbytes']:>8.0f}{r['weight_mbytes']:>11.0f}{r['roofline_ms']:>12.2f}{r['x_roofline']:>11.2f}")


def bench_ffd_generate(contexts=(8192, 16000), new_tokens=(4, 20), repeats: int = 3, *, delta: float = 5.0,
                       page_size: int = 64, vocab_size: int = 16384) -> dict:
    """Decode ms per token of `generate` on the induction LM: dense, FFD with pages, FFD re-quantizing."""
    dense = induction_lm(InductionSpec(vocab_size=vocab_size))
    ffd = with_decode(dense, "ffd", delta=float(delta), page_size=page_size)
    n1, n2 = new_tokens
    graphdef, state = nnx.split(ffd)
    prefill = jax.jit(lambda s, p, c: nnx.merge(graphdef, s)(p, cache=c).cache)
    rows = []
    for context in contexts:
        task = SpanCopyTask(vocab_size=vocab_size).prompts(0, batch_size=1, context_len=context, answer_len=n2)
        prompts = jnp.asarray(task["prompts"])
        paged = prefill(state, prompts[:, :-1], ffd.init_cache(1, context + n2))  # all but x: generate appends it
        caches = {"dense": (dense, paged.replace(pages=None)), "ffd_pages": (ffd, paged),
                  "ffd_requantize": (ffd, paged.replace(pages=None))}
        calls = {(name, n): (lambda m=m, c=c, n=n: generate(m, prompts[:, -1:], max_new_tokens=n, cache=c).tokens)
                 for name, (m, c) in caches.items() for n in (n1, n2)}
        times = kb._timed(calls, repeats)
        ms = {name: (times[(name, n2)] - times[(name, n1)]) / (n2 - n1) * 1e3 for name in caches}
        tokens = {name: np.asarray(calls[(name, n2)]())[0] for name in caches}
        step = nnx.merge(graphdef, state)(prompts[:, -1:], cache=paged)
        rows.append({"context": context, "pages": paged.pages[0].num_pages, "ms_per_token": ms,
                     "vs_dense": {name: ms[name] / ms["dense"] for name in caches},
                     "kept_per_layer": [float(x) for x in step.intermediates["ffd_kept_fraction"]],
                     "same_tokens": bool(all(np.array_equal(t, tokens["dense"]) for t in tokens.values())),
                     "copy_accuracy": {name: float(np.mean(t == task["answers"][0])) for name, t in tokens.items()}})
        del paged, caches
    return {"model": f"induction LM {fingerprint(dense)}", "delta": delta, "page_size": page_size,
            "gather_fraction": ffd.config.attention.ffd.gather_fraction, "new_tokens": list(new_tokens), "rows": rows}


def _print_ffd_generate(res: dict) -> None:
    print(f"\nFFD decoding end to end ({res['model']}, span copy, delta={res['delta']}, pages of {res['page_size']}; "
          f"ms per decode token, tokens {res['new_tokens'][0]} vs {res['new_tokens'][1]})")
    print(f"{'context':>8}{'dense':>8}{'FFD pages':>11}{'FFD requant':>13}{'pages/dense':>13}{'kept per layer':>16}"
          f"{'same tokens':>13}{'accuracy':>10}")
    for r in res["rows"]:
        ms, kept = r["ms_per_token"], "/".join(f"{k:.1%}" for k in r["kept_per_layer"])
        print(f"{r['context']:>8}{ms['dense']:>8.2f}{ms['ffd_pages']:>11.2f}{ms['ffd_requantize']:>13.2f}"
              f"{r['vs_dense']['ffd_pages']:>13.2f}{kept:>16}{str(r['same_tokens']):>13}"
              f"{r['copy_accuracy']['ffd_pages']:>10.0%}")


def bench_moe(expert_counts=(8, 32), repeats: int = 5, *, tokens: int = 2048, d_model: int = 256,
              d_ff: int = 512, top_k: int = 2) -> list[dict]:
    """MoE FFN forward: grouped matmul (dropless, sorted by expert) vs the dense all-experts einsum."""
    rows = []
    x = kb._normal(jax.random.key(1), (1, tokens, d_model))
    for num_experts in expert_counts:
        cfg = TransformerConfig(vocab_size=8, d_model=d_model, num_layers=1, num_heads=4, num_kv_heads=4,
                                d_ff=d_ff, ffn_type="moe",
                                moe=MoEConfig(num_experts=num_experts, experts_per_token=top_k))
        ffn = MoEFFN(cfg, rngs=nnx.Rngs(0))
        grouped = {}
        for impl in ("xla", "xla_tiled"):
            ffn.implementation = impl
            gd, st = nnx.split(ffn)
            grouped[impl] = (jax.jit(lambda st, x, gd=gd: nnx.merge(gd, st)(x)[0]), st)
        gd, st = nnx.split(ffn)
        dense = jax.jit(lambda st, x: dense_moe_reference(nnx.merge(gd, st), x))
        want = dense(st, x)
        err = {k: float(jnp.max(jnp.abs(f(s, x) - want))) for k, (f, s) in grouped.items()}
        times = kb._timed({"grouped_xla": lambda: grouped["xla"][0](grouped["xla"][1], x),
                        "grouped_xla_tiled": lambda: grouped["xla_tiled"][0](grouped["xla_tiled"][1], x),
                        "dense_einsum": lambda: dense(st, x)}, repeats)
        n = tokens * top_k  # routed rows
        # three expert matmuls (gate, up: D -> f; down: f -> D)
        g = [gmm_cost_lib.gmm_cost(m=n, k=d_model, n=d_ff, num_groups=num_experts)] * 2 + [
            gmm_cost_lib.gmm_cost(m=n, k=d_ff, n=d_model, num_groups=num_experts)]
        dn = [gmm_cost_lib.dense_experts_cost(tokens=tokens, k=d_model, n=d_ff, num_groups=num_experts)] * 2 + [
            gmm_cost_lib.dense_experts_cost(tokens=tokens, k=d_ff, n=d_model, num_groups=num_experts)]
        rows.append({"experts": num_experts, "top_k": top_k, "tokens": tokens, "d_model": d_model, "d_ff": d_ff,
                     "grouped_gflops": sum(c.flops for c in g) / 1e9, "dense_gflops": sum(c.flops for c in dn) / 1e9,
                     "grouped_mbytes": sum(c.bytes_accessed for c in g) / 1e6,
                     "dense_mbytes": sum(c.bytes_accessed for c in dn) / 1e6,
                     "ms": {k: v * 1e3 for k, v in times.items()}, "max_abs_err_vs_dense": err,
                     "speedup_xla_vs_dense": times["dense_einsum"] / times["grouped_xla"],
                     "speedup_xla_tiled_vs_dense": times["dense_einsum"] / times["grouped_xla_tiled"]})
    return rows


def _print_moe(rows: list[dict]) -> None:
    print("\nMoE FFN forward, top-k of E experts (grouped matmul vs dense all-experts einsum)")
    print(f"{'E':>4}{'k':>3}{'GFLOP grp':>11}{'GFLOP dense':>12}{'ms ragged':>11}{'ms tiled':>10}{'ms dense':>10}"
          f"{'x ragged':>10}{'x tiled':>9}{'max err':>10}")
    for r in rows:
        m = r["ms"]
        print(f"{r['experts']:>4}{r['top_k']:>3}{r['grouped_gflops']:>11.2f}{r['dense_gflops']:>12.2f}"
              f"{m['grouped_xla']:>11.2f}{m['grouped_xla_tiled']:>10.2f}{m['dense_einsum']:>10.2f}"
              f"{r['speedup_xla_vs_dense']:>10.2f}{r['speedup_xla_tiled_vs_dense']:>9.2f}"
              f"{max(r['max_abs_err_vs_dense'].values()):>10.1e}")


def _run_generate(args) -> dict:
    res = bench_generate([int(t) for t in args.generate_tokens.split(",")], repeats=max(3, args.repeats))
    _print_generate(res)
    return {"generate": res}


def _run_moe(args) -> dict:
    rows = bench_moe(repeats=args.repeats)
    _print_moe(rows)
    return {"moe": rows}


def _run_ffd_generate(args) -> dict:
    res = bench_ffd_generate()
    _print_ffd_generate(res)
    return {"ffd_generate": res}


SECTIONS = {**kb.SECTIONS, "generate": _run_generate, "ffd_generate": _run_ffd_generate, "moe": _run_moe}


def _arguments(parser) -> None:
    parser.add_argument("--generate-tokens", default="2048,8192,32768",
                        help="comma list of context lengths for the generate section")


def main(argv=None) -> dict:
    return kb.main(argv, sections=SECTIONS, extra_arguments=_arguments, description=__doc__.split("\n")[0])


if __name__ == "__main__":
    main()
