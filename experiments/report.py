"""Result files and the reproduction report.

`run_experiment` runs one experiment preset in `results/<slug>/<preset>/` (the
workdir; checkpoints go to its `ckpt/`, which git ignores); a config that differs
from the preset's (command-line overrides) runs in its own
`results/<slug>/<preset>-<hash of the config>/`, so it never resumes another
run's checkpoint. It then writes in the workdir

  * `result.json`: config, metrics, verdict, plots, wall time, device count, versions;
  * `summary.md`: the same for humans, with the plots inline.

`write_report(results_dir, preset=...)` collects the `<slug>/<preset>/result.json`
files of one preset into one report: `results/REPORT.md` (tracked by git) for
the `quick` preset that `make reproduce` runs, `results/REPORT-<preset>.md`
for the others. Each holds one table with the paper's claim beside ours, then
one section per experiment with its verdict and plots.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import pathlib
import platform
import time
from typing import Any

import jax
import numpy as np

from experiments import registry

__all__ = ["run_experiment", "default_workdir", "write_report", "report_path", "load_results", "savefig"]


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


def _config_key(cfg: Any) -> str:
    return json.dumps(_jsonable(cfg), sort_keys=True)


def default_workdir(slug: str, preset: str, config: Any = None, *,
                    results_dir: str | pathlib.Path = "results") -> pathlib.Path:
    """The run directory of `slug` at `preset`: `results_dir/<slug>/<preset>` for the preset's own config,
    `results_dir/<slug>/<preset>-<8 hex digits>` (a hash of the whole config) for any other config."""
    exp = registry.get(slug)
    base = pathlib.Path(results_dir) / slug
    if config is None:
        return base / preset
    key = _config_key(config)
    if key == _config_key(exp.config(preset)):
        return base / preset
    return base / f"{preset}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"


def run_experiment(slug: str, preset: str, *, results_dir: str | pathlib.Path = "results",
                   config: Any = None, workdir: str | pathlib.Path | None = None) -> dict:
    """Runs `slug` at `preset` (or an explicit `config`) and writes its result files.

    The workdir defaults to :func:`default_workdir` (a config other than the preset's gets its own).
    Raises `registry.ConfigError` (a ValueError) naming the field when a shared check fails
    (`registry.check_config`: NaN, non-positive learning rates, step or batch counts < 1).
    """
    exp = registry.get(slug)
    cfg = exp.config(preset) if config is None else config
    registry.check_config(cfg)
    workdir = pathlib.Path(workdir) if workdir else default_workdir(slug, preset, cfg, results_dir=results_dir)
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
        "devices": jax.device_count(),
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
              f"{r['environment']['backend']} x{_devices(r)} device(s), JAX {r['environment']['jax']}.", ""]
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


def _devices(r: dict) -> Any:
    return r.get("devices", r.get("environment", {}).get("devices", "?"))


def load_results(results_dir: str | pathlib.Path = "results", *, preset: str | None = None) -> list[dict]:
    """The `<slug>/<preset>/result.json` files under results_dir (every preset when None), in registry order.

    Runs with overridden configs (`<slug>/<preset>-<hash>/`) are not collected.
    """
    results_dir = pathlib.Path(results_dir)
    order = {s: i for i, s in enumerate(registry.all_slugs())}
    pattern = f"*/{preset}/result.json" if preset else "*/*/result.json"
    found = [json.loads(p.read_text()) for p in sorted(results_dir.glob(pattern))
             if p.parent.name in registry.PRESETS]
    return sorted(found, key=lambda r: (order.get(r["slug"], len(order)), registry.PRESETS.index(r["preset"])
                                        if r["preset"] in registry.PRESETS else 9))


def report_path(results_dir: str | pathlib.Path = "results", preset: str = "quick") -> pathlib.Path:
    """`results_dir/REPORT.md` for the quick preset (the tracked report), `results_dir/REPORT-<preset>.md` else."""
    name = "REPORT.md" if preset == "quick" else f"REPORT-{preset}.md"
    return pathlib.Path(results_dir) / name


def write_report(results_dir: str | pathlib.Path = "results", *, preset: str = "quick") -> pathlib.Path:
    """Writes the report of one preset (see :func:`report_path`) from its result.json files in results_dir.

    Raises:
      ValueError: results_dir is not an existing directory, preset is unknown, or no result of the
        preset is there.
    """
    results_dir = pathlib.Path(results_dir)
    if preset not in registry.PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {list(registry.PRESETS)}")
    if not results_dir.is_dir():
        raise ValueError(f"results directory {str(results_dir)!r} does not exist (or is not a directory); "
                         f"pass the --results-dir that `run` wrote to")
    results = load_results(results_dir, preset=preset)
    if not results:
        raise ValueError(f"no {preset!r} results in {str(results_dir)!r} (looked for <slug>/{preset}/result.json); "
                         f"run `python -m experiments run <slug> --preset {preset}` first")
    lines = [
        "# Reproduction report" + ("" if preset == "quick" else f" ({preset} preset)"),
        "",
        f"Written by `python -m experiments run ... --preset {preset}` from the `<slug>/{preset}/result.json` "
        "files beside this report (`make reproduce` runs every implemented experiment at the `quick` preset on "
        "CPU and writes `results/REPORT.md`). Each row: the paper's claim, the paper's number, our small-scale "
        "number and whether the direction of the claim reproduced. `devices` is the JAX device count of the run "
        "(`make reproduce` simulates 8 CPU devices, a plain CLI run has 1): compare throughput only at equal "
        "counts. Details and plots follow the table.",
        "",
        "| experiment | preset | paper | ours | reproduced | wall s | devices |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        mark = {True: "yes", False: "**no**", None: "n/a"}[r["reproduced"]]
        ours = r["verdict"].replace("|", "/").replace("\n", " ")
        paper = (r["paper_result"] or r["claim"]).replace("|", "/")
        lines.append(f"| [{r['slug']}](#{r['slug']}-{r['preset']}) | {r['preset']} | {paper} | {ours} | {mark} | "
                     f"{r['wall_s']} | {_devices(r)} |")
    lines.append("")
    for r in results:
        lines.append(_summary_md(r, plot_prefix=f"{r['slug']}/{r['preset']}/"))
    path = report_path(results_dir, preset)
    path.write_text("\n".join(lines))
    return path
