"""Result files and the reproduction report.

`run_experiment` runs one experiment preset in `results/<slug>/<preset>/` (the
workdir; checkpoints go to its `ckpt/`, which git ignores), then writes there

  * `result.json`: config, metrics, verdict, plots, wall time, versions;
  * `summary.md`: the same for humans, with the plots inline.

`write_report(results_dir)` collects every `result.json` into
`results/REPORT.md`: one table with the paper's claim beside ours, then one
section per experiment with its verdict and plots.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import pathlib
import platform
import time
from typing import Any

import jax
import numpy as np

from experiments import registry

__all__ = ["run_experiment", "write_report", "load_results", "savefig"]


def _jsonable(x: Any) -> Any:
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return _jsonable(dataclasses.asdict(x))
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.generic, jax.Array)) or hasattr(x, "__array__"):
        arr = np.asarray(x)
        return arr.item() if arr.ndim == 0 else arr.tolist()
    if isinstance(x, float) and not np.isfinite(x):
        return str(x)
    return x


def savefig(fig, path: pathlib.Path) -> str:
    """Saves a matplotlib figure (see `experiments._plotting`) as PNG and returns the file name."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return pathlib.Path(path).name


def run_experiment(slug: str, preset: str, *, results_dir: str | pathlib.Path = "results",
                   config: Any = None, workdir: str | pathlib.Path | None = None) -> dict:
    """Runs `slug` at `preset` (or an explicit `config`) and writes its result files."""
    exp = registry.get(slug)
    cfg = exp.config(preset) if config is None else config
    workdir = pathlib.Path(workdir) if workdir else pathlib.Path(results_dir) / slug / preset
    workdir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    out = exp.run(cfg, workdir)
    wall = time.perf_counter() - start
    for key in ("metrics", "verdict", "reproduced"):
        if key not in out:
            raise KeyError(f"experiments/{slug}.py run() must return a {key!r} entry; got {sorted(out)}")
    entry = exp.paper
    result = {
        "slug": slug,
        "preset": preset,
        "title": exp.title,
        "claim": exp.paper_claim,
        "paper_result": entry.paper_result if entry else "",
        "config": _jsonable(cfg),
        "metrics": _jsonable(out["metrics"]),
        "verdict": out["verdict"],
        "reproduced": out["reproduced"],
        "plots": list(out.get("plots", [])),
        "wall_s": round(wall, 2),
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "environment": {"jax": jax.__version__, "backend": jax.default_backend(),
                        "devices": jax.device_count(), "python": platform.python_version()},
    }
    (workdir / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    (workdir / "summary.md").write_text(_summary_md(result, plot_prefix=""))
    return result


def _summary_md(r: dict, *, plot_prefix: str) -> str:
    lines = [f"## {r['slug']} ({r['preset']})", "", f"**{r['title']}**", ""]
    if r["claim"]:
        lines += [f"Claim checked: {r['claim']}", ""]
    if r["paper_result"]:
        lines += [f"Paper: {r['paper_result']}", ""]
    mark = {True: "reproduced", False: "NOT reproduced", None: "no verdict"}[r["reproduced"]]
    lines += [f"Verdict ({mark}): {r['verdict']}", "", f"Wall time: {r['wall_s']} s on "
              f"{r['environment']['backend']} x{r['environment']['devices']}, JAX {r['environment']['jax']}.", ""]
    scalars = {k: v for k, v in r["metrics"].items() if isinstance(v, (int, float, str, bool))}
    if scalars:
        lines += ["| metric | value |", "| --- | --- |"]
        lines += [f"| {k} | {_fmt(v)} |" for k, v in scalars.items()]
        lines.append("")
    lines += [f"![{p}]({plot_prefix}{p})" for p in r["plots"]]
    return "\n".join(lines) + "\n"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def load_results(results_dir: str | pathlib.Path = "results") -> list[dict]:
    """All result.json files under results_dir, in registry order."""
    results_dir = pathlib.Path(results_dir)
    order = {s: i for i, s in enumerate(registry.all_slugs())}
    found = [json.loads(p.read_text()) for p in sorted(results_dir.glob("*/*/result.json"))]
    return sorted(found, key=lambda r: (order.get(r["slug"], len(order)), registry.PRESETS.index(r["preset"])
                                        if r["preset"] in registry.PRESETS else 9))


def write_report(results_dir: str | pathlib.Path = "results") -> pathlib.Path:
    """Writes results_dir/REPORT.md from every result.json found there."""
    results_dir = pathlib.Path(results_dir)
    results = load_results(results_dir)
    lines = [
        "# Reproduction report",
        "",
        "Written by `python -m experiments run ...` (`make reproduce` runs every implemented experiment at the "
        "`quick` preset on CPU). Each row: the paper's claim, the paper's number, our small-scale number and "
        "whether the direction of the claim reproduced. Details and plots follow the table.",
        "",
        "| experiment | preset | paper | ours | reproduced | wall s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        mark = {True: "yes", False: "**no**", None: "n/a"}[r["reproduced"]]
        ours = r["verdict"].replace("|", "/").replace("\n", " ")
        paper = (r["paper_result"] or r["claim"]).replace("|", "/")
        lines.append(f"| [{r['slug']}](#{r['slug']}-{r['preset']}) | {r['preset']} | {paper} | {ours} | {mark} | "
                     f"{r['wall_s']} |")
    lines.append("")
    for r in results:
        lines.append(_summary_md(r, plot_prefix=f"{r['slug']}/{r['preset']}/"))
    path = results_dir / "REPORT.md"
    results_dir.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path
