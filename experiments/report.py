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

`paper_status(entry)` derives a paper's catalog status and its "ours" cell from the
latest `results/<slug>/quick/result.json`: "verified" only when that result carries
its claim checks and every required one passed; "ours" is the experiment module's
`headline(metrics)` applied to the stored metrics. The README's catalog table is
built from it (`python -m experiments catalog --markdown`), so it cannot drift
from the results.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import importlib
import json
import os
import platform
import time
from typing import Any, NamedTuple

import jax
import numpy as np
from etils import epath

from experiments import checks as checks_lib
from experiments import registry

__all__ = ["run_experiment", "default_workdir", "write_report", "report_path", "load_results", "savefig",
           "paper_status", "PaperStatus", "show_result", "stored_result", "REPO_RESULTS"]

# The checkout's results folder (what `make reproduce` writes); absent in a plain `pip install`.
REPO_RESULTS = epath.Path(__file__).resolve().parents[1] / "results"


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


def savefig(fig, path: str | os.PathLike) -> str:
    """Saves a matplotlib figure (see `experiments._plotting`) as PNG and returns the file name.

    The file is written through `etils.epath`, so ``path`` may be remote (``gs://...``).
    """
    fig.tight_layout()
    path = epath.Path(path)
    with path.open("wb") as f:
        fig.savefig(f, format="png", dpi=110)
    return path.name


def _config_key(cfg: Any) -> str:
    return json.dumps(_jsonable(cfg), sort_keys=True)


def default_workdir(slug: str, preset: str, config: Any = None, *,
                    results_dir: str | os.PathLike = "results") -> epath.Path:
    """The run directory of `slug` at `preset`: `results_dir/<slug>/<preset>` for the preset's own config,
    `results_dir/<slug>/<preset>-<8 hex digits>` (a hash of the whole config) for any other config.
    An `etils.epath.Path`: a remote results_dir (``gs://...``) stays remote."""
    exp = registry.get(slug)
    base = epath.Path(results_dir) / slug
    if config is None:
        return base / preset
    key = _config_key(config)
    if key == _config_key(exp.config(preset)):
        return base / preset
    return base / f"{preset}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"


def run_experiment(slug: str, preset: str, *, results_dir: str | os.PathLike = "results",
                   config: Any = None, workdir: str | os.PathLike | None = None) -> dict:
    """Runs `slug` at `preset` (or an explicit `config`) and writes its result files.

    The workdir defaults to :func:`default_workdir` (a config other than the preset's gets its own).
    Raises `registry.ConfigError` (a ValueError) naming the field when a shared check fails
    (`registry.check_config`: NaN, non-positive learning rates, step or batch counts < 1).
    """
    exp = registry.get(slug)
    cfg = exp.config(preset) if config is None else config
    registry.check_config(cfg)
    workdir = epath.Path(workdir) if workdir else default_workdir(slug, preset, cfg, results_dir=results_dir)
    workdir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    out = exp.run(cfg, workdir)
    wall = time.perf_counter() - start
    for key in ("metrics", "verdict", "reproduced"):
        if key not in out:
            raise KeyError(f"experiments/{slug}.py run() must return a {key!r} entry; got {sorted(out)}")
    cause = out.get("cause")
    if cause is not None and cause not in checks_lib.CAUSES:
        raise ValueError(f"experiments/{slug}.py run() returned cause {cause!r}; expected one of "
                         f"{sorted(checks_lib.CAUSES)} or None")
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
        "cause": None if out["reproduced"] else cause,
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


def load_results(results_dir: str | os.PathLike = "results", *, preset: str | None = None) -> list[dict]:
    """The `<slug>/<preset>/result.json` files under results_dir (every preset when None), in registry order.

    Runs with overridden configs (`<slug>/<preset>-<hash>/`) are not collected.
    """
    results_dir = epath.Path(results_dir)
    order = {s: i for i, s in enumerate(registry.all_slugs())}
    pattern = f"*/{preset}/result.json" if preset else "*/*/result.json"
    found = [json.loads(p.read_text()) for p in sorted(results_dir.glob(pattern))
             if p.parent.name in registry.PRESETS]
    return sorted(found, key=lambda r: (order.get(r["slug"], len(order)), registry.PRESETS.index(r["preset"])
                                        if r["preset"] in registry.PRESETS else 9))


def stored_result(slug: str, preset: str = "quick", *, results_dir: str | os.PathLike = REPO_RESULTS) -> dict | None:
    """The stored ``<results_dir>/<slug>/<preset>/result.json`` as a dict, or None when there is none
    (e.g. a quick verdict citing the committed result of its experiment's study preset)."""
    path = epath.Path(results_dir) / slug / preset / "result.json"
    return json.loads(path.read_text()) if path.exists() else None


def show_result(slug: str, *, preset: str = "quick", results_dir: str | os.PathLike = REPO_RESULTS,
                rerun: bool = False) -> dict:
    """Prints a stored result the way the notebooks read it: reproduced, cause, the catalog's "ours"
    cell (the experiment's ``headline``) and every claim check; returns the result dict ({} if none).

    Args:
      slug: the experiment.
      preset: whose ``<slug>/<preset>/result.json`` to read.
      results_dir: where results live (default: this checkout's ``results/``).
      rerun: run the preset first (`run_experiment`), which writes a fresh result there.
    """
    if rerun:
        run_experiment(slug, preset, results_dir=results_dir)
    result = stored_result(slug, preset, results_dir=results_dir)
    if result is None:
        print(f"no stored result at {epath.Path(results_dir) / slug / preset / 'result.json'}; "
              f"run `python -m experiments run {slug} --preset {preset}`")
        return {}
    print("reproduced:", result["reproduced"], "| cause:", result.get("cause"))
    print("ours:", importlib.import_module(f"experiments.{slug}").headline(result["metrics"]))
    for check in result["metrics"].get("checks", []):
        note = "" if check.get("required", True) else " [not required]"
        print(f"  {'PASS' if check['passed'] else 'FAIL'} {check['name']}: {check['measured']} "
              f"(pass if {check['threshold']}){note}")
    return result


class PaperStatus(NamedTuple):
    """A paper's catalog status and "ours" cell, as derived from its latest quick result.

    Attributes:
      status: "planned" (no experiment module), "implemented" (module, no passing quick result; with
        "; not reproduced: <cause class>" when the result names why, see `experiments.checks.CAUSES`)
        or "verified" (the quick result's required claim checks all passed).
      ours: the experiment's ``headline(metrics)`` of the quick result ("" without a result).
      result: the quick ``result.json`` path, or None when there is none.
      problem: why the result cannot decide the status ("" when it can): no result, no checks
        list, or ``reproduced`` disagreeing with the checks.
    """

    status: str
    ours: str
    result: epath.Path | None
    problem: str


def _required_checks_pass(checks: Any) -> bool | None:
    """True/False when ``checks`` is a list of `Check.as_dict` records with a required one; None else."""
    if not isinstance(checks, list) or not checks:
        return None
    if not all(isinstance(c, dict) and "passed" in c for c in checks):
        return None
    required = [c for c in checks if c.get("required", True)]
    return all(bool(c["passed"]) for c in required) if required else None


def paper_status(entry: Any, results_dir: str | os.PathLike = "results") -> PaperStatus:
    """Status and "ours" cell of a catalog entry, derived from ``results_dir/<slug>/quick/result.json``.

    Args:
      entry: a `experiments.catalog.CatalogEntry`.
      results_dir: where `run` wrote the results (the repository's ``results/``).

    Returns:
      A `PaperStatus`. A paper is "verified" only when its quick result stores its claim checks
      (``metrics["checks"]``, see `experiments.checks`) and every required one passed.
    """
    if entry.status == "planned":
        return PaperStatus("planned", "", None, "")
    path = epath.Path(results_dir) / entry.slug / "quick" / "result.json"
    if not path.is_file():
        return PaperStatus("implemented", "", None, f"no quick result at {path}")
    r = json.loads(path.read_text())
    metrics = r.get("metrics", {})
    ok = _required_checks_pass(metrics.get("checks"))
    problem = ""
    if ok is None:
        problem = "the quick result stores no list of claim checks (metrics['checks']); rerun its quick preset"
    elif ok != bool(r.get("reproduced")):
        problem = f"reproduced={r.get('reproduced')} disagrees with its required checks (all passed: {ok})"
    module = importlib.import_module(f"experiments.{entry.slug}")
    headline = getattr(module, "headline", None)
    ours = headline(metrics) if headline is not None else ""
    status = "verified" if ok and not problem else "implemented"
    if ok is False and not problem and r.get("cause") in checks_lib.CAUSES:
        status += f"; not reproduced: {r['cause']}"
    return PaperStatus(status, " ".join(ours.split()), path, problem)


def report_path(results_dir: str | os.PathLike = "results", preset: str = "quick") -> epath.Path:
    """`results_dir/REPORT.md` for the quick preset (the tracked report), `results_dir/REPORT-<preset>.md` else."""
    name = "REPORT.md" if preset == "quick" else f"REPORT-{preset}.md"
    return epath.Path(results_dir) / name


def write_report(results_dir: str | os.PathLike = "results", *, preset: str = "quick",
                 elapsed: dict | None = None) -> epath.Path:
    """Writes the report of one preset (see :func:`report_path`) from its result.json files in results_dir.

    `elapsed` ({"seconds", "jobs", "runs"}), given by `run --jobs`, is the wall time of a whole multi-run
    command; it is kept in <results_dir>/<preset>-elapsed.json and shown by later reports until the next one.

    Raises:
      ValueError: results_dir is not an existing directory, preset is unknown, or no result of the
        preset is there.
    """
    results_dir = epath.Path(results_dir)
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
    total = sum(float(r["wall_s"]) for r in results)
    lines += ["", f"Sum of the wall times of these {len(results)} runs: {total / 60:.1f} min "
                  f"(each run's own time in the `wall s` column; runs made on a shared machine, or beside "
                  f"another run under `--jobs`, take longer)."]
    elapsed_path = results_dir / f"{preset}-elapsed.json"
    if elapsed is not None:
        elapsed_path.write_text(json.dumps(elapsed) + "\n")
    if elapsed_path.exists():
        e = json.loads(elapsed_path.read_text())
        lines.append(f"Last multi-run command: {e['runs']} runs in {e['seconds'] / 60:.1f} min of wall time "
                     f"with `--jobs {e['jobs']}`.")
    lines.append("")
    for r in results:
        lines.append(_summary_md(r, plot_prefix=f"{r['slug']}/{r['preset']}/"))
    path = report_path(results_dir, preset)
    path.write_text("\n".join(lines))
    return path
