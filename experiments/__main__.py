"""Command line: list, run and report the experiments.

    python -m experiments list                          # all papers + foundation, with status
    python -m experiments run lm_arithmetic --preset quick
    python -m experiments run lm_arithmetic --preset smoke --train.num-steps 50   # field overrides
    python -m experiments run all --preset quick --jobs 2   # what `make reproduce` calls
    python -m experiments run vegas,ffd --preset quick  # a subset
    python -m experiments report                        # rebuild results/REPORT.md (quick results)
    python -m experiments run lm_arithmetic --help      # the run options and the config's fields
    python -m experiments catalog --markdown            # the README's paper table
    python -m experiments bench --only decode,generate  # benchmarks (experiments/bench.py)
    python -m experiments aot lm_1b --topology v5e:4x4  # a training step compiled for a TPU slice (experiments/aot.py)

Config field overrides after the slug are parsed by tyro against the
experiment's config dataclass, starting from the chosen preset
(`--help` after the slug lists the fields). A run with overrides gets its own
run directory, results/<slug>/<preset>-<hash of the config>/, so it never
resumes another run's checkpoint. Only the quick preset (what `make reproduce`
runs) updates the tracked results/REPORT.md; smoke and paper write
<results-dir>/REPORT-<preset>.md, and study presets (an experiment's own extra
presets that settle one question, e.g. nmars's diff_study) and runs with
overrides or --workdir write only their own summary.md. Every result carries the JAX device count
(`make reproduce` simulates 8 CPU devices, a plain run has 1).

`--jobs N` runs up to N experiments at once, each in its own process (most
quick presets keep about one core busy, so two jobs on two cores roughly halve
`make reproduce`); the longest runs (by their last stored wall time) start
first, each run's output goes to <run dir>/run.log, and the report is written
once at the end. A run's own `wall_s` is then measured beside another run.

Unknown slugs, presets and fields, and values no run can use (a step or batch
count < 1, a NaN or non-positive learning rate), fail with exit code 2 and a
message that names them.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import re
import subprocess
import sys
import time

from experiments import catalog, registry


def cmd_list(args) -> int:
    from experiments import report

    implemented = set(registry.implemented_slugs())
    print(f"{'slug':24s} {'status':12s} {'area':14s} title")
    for slug, title in registry.FOUNDATION.items():
        status = "implemented" if slug in implemented else "planned"
        print(f"{slug:24s} {status:12s} {'foundation':14s} {title}")
    statuses = [report.paper_status(e, args.results_dir).status for e in catalog.CATALOG]
    for e, status in zip(catalog.CATALOG, statuses):
        print(f"{e.slug:24s} {status:12s} {e.area:14s} {e.title}")
    n_impl = sum(s != "planned" for s in statuses)
    n_ver = sum(s == "verified" for s in statuses)
    print(f"\n{len(catalog.CATALOG)} papers, {n_impl} implemented, {n_ver} of them verified at the quick preset; "
          f"runnable experiments: {', '.join(sorted(implemented))}")
    return 0


def markdown_table(results_dir: str | os.PathLike = "results") -> str:
    """The README's paper catalog table (kept in sync by a test); status and "ours" come from the quick results."""
    from experiments import report

    rows = ["| # | slug | paper | area | code | status | paper's result | ours (CPU scale) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for i, e in enumerate(catalog.CATALOG, 1):
        st = report.paper_status(e, results_dir)
        arxiv = f" ([arXiv {e.arxiv}](https://arxiv.org/abs/{e.arxiv}))" if e.arxiv else ""
        inferred = f"<br>inferred: {e.inferred.replace('|', '/')}" if e.inferred else ""
        rows.append(f"| {i} | `{e.slug}` | {e.short}{arxiv} | {e.area} | `{e.code}`{inferred} | {st.status} | "
                    f"{e.paper_result.replace('|', '/')} | {st.ours.replace('|', '/') or '-'} |")
    return "\n".join(rows)


def cmd_catalog(args) -> int:
    if args.markdown:
        print(markdown_table(args.results_dir))
    else:
        from experiments import report

        for e in catalog.CATALOG:
            print(f"{e.slug}: {e.title} [{report.paper_status(e, args.results_dir).status}]")
    return 0


def _parse_slugs(spec: str) -> list[str]:
    if spec == "all":
        return registry.implemented_slugs()
    slugs = [s.strip() for s in spec.split(",") if s.strip()]
    for s in slugs:
        registry.get(s)  # raises with a clear message for unknown or planned slugs
    return slugs


def _field_paths(config) -> dict[str, str]:
    """Leaf field name -> dotted path in `config`, nested config dataclasses included (the shallowest path wins)."""
    paths: dict[str, str] = {}
    level = [("", config)]
    while level:
        nested = []
        for prefix, obj in level:
            for f in dataclasses.fields(obj):
                paths.setdefault(f.name, prefix + f.name)
                value = getattr(obj, f.name)
                if dataclasses.is_dataclass(value) and not isinstance(value, type):
                    nested.append((f"{prefix}{f.name}.", value))
        level = nested
    return paths


def _flag_message(err: ValueError, config) -> str:
    """A config error as the CLI user sees it: field names become the flags they typed (num_steps -> --num-steps).

    `registry.ConfigError` carries its field; in other messages (an experiment's `__post_init__`), field names
    with an underscore, and the message's first word when it is a field, are replaced by their flags.
    """
    if isinstance(err, registry.ConfigError):
        return f"{registry.cli_flag(err.field)} {err.message}"
    text = str(err)
    paths = _field_paths(config)
    names = sorted((n for n in paths if "_" in n or text.startswith(n + " ")), key=len, reverse=True)
    if not names:
        return text
    pattern = re.compile(r"(?<![\w.\-])(" + "|".join(map(re.escape, names)) + r")(?![\w(])")
    return pattern.sub(lambda m: registry.cli_flag(paths[m.group(1)]), text)


def _parse_overrides(config_cls: type, overrides: list[str], base, prog: str):
    """`base` with the overrides, parsed by tyro; the config's own `__post_init__` runs here, not inside tyro.

    tyro reports a ValueError from the root class's constructor itself (in its own box, naming the field in
    snake_case); parsing into a subclass without `__post_init__` and then building the real config lets
    `_flag_message` name the flags the user typed. Nested config sections are still checked by tyro.
    """
    import tyro

    unchecked = type(config_cls.__name__, (config_cls,), {
        "__post_init__": lambda self: None, "__doc__": config_cls.__doc__,
        "__module__": config_cls.__module__, "__qualname__": config_cls.__qualname__})
    parsed = tyro.cli(unchecked, args=overrides, default=base, prog=prog)
    return config_cls(**{f.name: getattr(parsed, f.name) for f in dataclasses.fields(config_cls) if f.init})


def _config(exp, preset: str, overrides: list[str], prog: str):
    """The preset's config with the command-line overrides (parsed by tyro), checked by `registry.check_config`."""
    cfg = base = exp.config(preset)
    try:
        if overrides:
            cfg = _parse_overrides(exp.config_cls, overrides, base, prog)
        registry.check_config(cfg)
    except ValueError as e:
        raise ValueError(f"bad config for {exp.slug!r} [{preset}]: {_flag_message(e, base)}") from e
    return cfg


def _run_help(p_run: argparse.ArgumentParser, args) -> int:
    """`run [<slug>] --help`: the run options, then (for one slug) the config fields tyro accepts."""
    p_run.print_help()
    slugs = _parse_slugs(args.slug) if args.slug else []
    if len(slugs) != 1:
        print("\nName one experiment (run <slug> --help) to list its config fields.")
        return 0
    import tyro

    exp = registry.get(slugs[0])
    print(f"\nPresets of {slugs[0]!r}: {', '.join(exp.presets)}")
    print(f"\nConfig fields of {slugs[0]!r}, with the {args.preset!r} preset's values as defaults:\n", flush=True)
    try:
        tyro.cli(exp.config_cls, args=["--help"], default=exp.config(args.preset),
                 prog=f"python -m experiments run {slugs[0]} --preset {args.preset}")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 0
    return 0


def cmd_run(args, overrides: list[str]) -> int:
    from experiments import report

    if overrides[:1] == ["--"]:
        overrides = overrides[1:]
    slugs = _parse_slugs(args.slug)
    if args.jobs < 1:
        raise ValueError(f"--jobs must be a whole number >= 1 (runs at once); got {args.jobs}")
    if overrides and len(slugs) != 1:
        raise SystemExit(f"config overrides {overrides} need exactly one slug; got {slugs}")
    # Build and check every config before the first run starts.
    configs = {slug: _config(registry.get(slug), args.preset, overrides, prog=f"python -m experiments run {slug}")
               for slug in slugs}
    if args.jobs > 1 and len(slugs) > 1 and not overrides and args.workdir is None:
        return _run_parallel(args, slugs)
    from algorithms import training

    if training.initialize_distributed():  # a multi-host job (a TPU pod slice): every host runs this command
        import jax

        print(f"==> host {jax.process_index()} of {jax.process_count()}, {jax.device_count()} devices", flush=True)
    summaries = []
    for slug in slugs:
        cfg = configs[slug]
        workdir = args.workdir or report.default_workdir(slug, args.preset, cfg, results_dir=args.results_dir)
        print(f"==> {slug} [{args.preset}] in {workdir}", flush=True)
        result = report.run_experiment(slug, args.preset, results_dir=args.results_dir, config=cfg,
                                       workdir=workdir)
        print(f"    {_mark(result)}: {result['verdict']}  ({result['wall_s']} s on {result.get('devices', '?')} "
              f"device(s))", flush=True)
        summaries.append(f"{workdir}/summary.md")
    if overrides or args.workdir is not None or args.no_report or args.preset not in registry.PRESETS:
        # A run with overrides or its own workdir is not a preset's result, and a study preset is one
        # experiment's own question: each keeps its own summary.md only.
        print(f"summary: {', '.join(summaries)}")
        return 0
    path = report.write_report(args.results_dir, preset=args.preset)
    print(f"report: {path}")
    return 0


def _mark(result: dict) -> str:
    return {True: "reproduced", False: "NOT reproduced", None: "no verdict"}[result["reproduced"]]


def _last_wall_s(results_dir: str, slug: str, preset: str) -> float:
    """The wall time stored by the slug's last run at this preset (0 when there is none): the scheduling order."""
    try:
        with open(os.path.join(results_dir, slug, preset, "result.json")) as f:
            return float(json.load(f).get("wall_s", 0.0))
    except (OSError, ValueError):
        return 0.0


def _run_parallel(args, slugs: list[str]) -> int:
    """`run --jobs N`: one child process per slug, at most N at once, longest last-known run first; then the report.

    Each child is `python -m experiments run <slug> --preset P --results-dir R --no-report` with its output in
    <run dir>/run.log. Returns 1 when any run failed (the others still finish), after naming the failures.
    """
    from experiments import report

    order = sorted(slugs, key=lambda s: -_last_wall_s(args.results_dir, s, args.preset))
    start = time.perf_counter()

    def child(slug: str) -> tuple[str, int, str]:
        workdir = report.default_workdir(slug, args.preset, results_dir=args.results_dir)
        workdir.mkdir(parents=True, exist_ok=True)
        log = workdir / "run.log"
        cmd = [sys.executable, "-m", "experiments", "run", slug, "--preset", args.preset,
               "--results-dir", str(args.results_dir), "--no-report"]
        with open(log, "w") as out:
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
        return slug, rc, str(log)

    print(f"==> {len(order)} experiments [{args.preset}], {args.jobs} at a time; output in <run dir>/run.log",
          flush=True)
    failed = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for slug, rc, log in pool.map(child, order):
            if rc != 0:
                failed.append(slug)
                print(f"    {slug}: FAILED (exit {rc}); see {log}", flush=True)
                continue
            with open(os.path.join(args.results_dir, slug, args.preset, "result.json")) as f:
                result = json.load(f)
            print(f"    {slug}: {_mark(result)} ({result['wall_s']} s)", flush=True)
    elapsed = time.perf_counter() - start
    print(f"{len(order) - len(failed)} of {len(order)} runs finished in {elapsed / 60:.1f} min "
          f"with --jobs {args.jobs}", flush=True)
    if args.preset in registry.PRESETS:
        path = report.write_report(args.results_dir, preset=args.preset,
                                   elapsed={"seconds": round(elapsed, 1), "jobs": args.jobs, "runs": len(order)}
                                   if not failed else None)
        print(f"report: {path}")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def cmd_report(args) -> int:
    from experiments import report

    print(report.write_report(args.results_dir, preset=args.preset))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_list = sub.add_parser("list", help="list every paper and experiment with its status")
    p_cat = sub.add_parser("catalog", help="print the paper catalog")
    p_cat.add_argument("--markdown", action="store_true", help="as the README's markdown table")
    for p in (p_list, p_cat):
        p.add_argument("--results-dir", default="results",
                       help="where the quick results that decide 'verified' and the 'ours' column are")
    p_run = sub.add_parser("run", help="run experiments: a slug, a comma list, or 'all'", add_help=False,
                           epilog="Arguments after the slug that this parser does not know are config "
                                  "field overrides, e.g. --train.num-steps 100 (`run <slug> --help` lists them). "
                                  "A run with overrides gets its own run directory "
                                  "<results-dir>/<slug>/<preset>-<hash of the config>.")
    p_run.add_argument("-h", "--help", action="store_true",
                       help="show this help and, after a slug, the experiment's config fields")
    p_run.add_argument("slug", nargs="?", help="an experiment slug, a comma list of slugs, or 'all'")
    p_run.add_argument("--preset", default="quick",
                       help="smoke, quick (default) or paper, or a study preset of the experiment (`run <slug> "
                            "--help` lists its presets; a study writes its run directory but no REPORT file)")
    p_run.add_argument("--results-dir", default="results",
                       help="where runs and reports go (default results; the quick preset updates "
                            "<results-dir>/REPORT.md, other presets <results-dir>/REPORT-<preset>.md)")
    p_run.add_argument("--jobs", type=int, default=1,
                       help="run up to this many experiments at once, each in its own process (default 1)")
    p_run.add_argument("--no-report", action="store_true", help=argparse.SUPPRESS)
    p_run.add_argument("--workdir", default=None,
                       help="override the run directory (default <results-dir>/<slug>/<preset>, or "
                            "<preset>-<hash> with overrides); such a run writes no REPORT file")
    sub.add_parser("bench", help="run the benchmarks (kernels and models); options: bench --help", add_help=False)
    sub.add_parser("aot", help="compile a training step for a TPU slice ahead of time (needs libtpu); "
                               "options: aot --help", add_help=False)
    p_rep = sub.add_parser("report", help="rebuild a preset's report from result files (quick: results/REPORT.md)")
    p_rep.add_argument("--results-dir", default="results", help="an existing directory that `run` wrote to")
    p_rep.add_argument("--preset", default="quick", choices=registry.PRESETS,
                       help="which results to collect (quick -> REPORT.md, others -> REPORT-<preset>.md)")

    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        from experiments import bench

        bench.main(rest)
        return 0
    if args.command == "aot":
        from experiments import aot

        return aot.main(rest)
    if args.command != "run" and rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        if args.command == "list":
            return cmd_list(args)
        if args.command == "catalog":
            return cmd_catalog(args)
        if args.command == "run":
            if args.help:
                return _run_help(p_run, args)
            if not args.slug:
                p_run.print_usage(sys.stderr)
                print("error: run needs a slug, a comma list of slugs, or 'all'", file=sys.stderr)
                return 2
            return cmd_run(args, rest)
        return cmd_report(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
