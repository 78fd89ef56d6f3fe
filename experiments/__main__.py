"""Command line: list, run and report the experiments.

    python -m experiments list                          # all papers + foundation, with status
    python -m experiments run lm_arithmetic --preset quick
    python -m experiments run lm_arithmetic --preset smoke --num-steps 50   # field overrides
    python -m experiments run all --preset quick        # what `make reproduce` calls
    python -m experiments run vegas,ffd --preset quick  # a subset
    python -m experiments report                        # rebuild results/REPORT.md
    python -m experiments catalog --markdown            # the README's paper table
    python -m experiments bench --only decode,generate  # benchmarks (experiments/bench.py)

Config field overrides after the slug are parsed by tyro against the
experiment's config dataclass, starting from the chosen preset
(`--help` after the slug lists the fields). Unknown slugs, presets and fields
fail with a message that names them.
"""

from __future__ import annotations

import argparse
import sys

from experiments import catalog, registry


def _status(slug: str) -> str:
    entry = registry.catalog_entry(slug)
    if entry is None:
        return "implemented" if slug in registry.implemented_slugs() else "planned"
    return entry.status


def cmd_list(_args) -> int:
    implemented = set(registry.implemented_slugs())
    print(f"{'slug':24s} {'status':12s} {'area':14s} title")
    for slug, title in registry.FOUNDATION.items():
        status = "implemented" if slug in implemented else "planned"
        print(f"{slug:24s} {status:12s} {'foundation':14s} {title}")
    for e in catalog.CATALOG:
        print(f"{e.slug:24s} {e.status:12s} {e.area:14s} {e.title}")
    n_impl = sum(e.status != "planned" for e in catalog.CATALOG)
    print(f"\n{len(catalog.CATALOG)} papers, {n_impl} implemented or verified; "
          f"runnable experiments: {', '.join(sorted(implemented))}")
    return 0


def markdown_table() -> str:
    """The README's paper catalog table (kept in sync by a test)."""
    rows = ["| # | slug | paper | area | code | status | paper's result | ours (CPU scale) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for i, e in enumerate(catalog.CATALOG, 1):
        arxiv = f" ([arXiv {e.arxiv}](https://arxiv.org/abs/{e.arxiv}))" if e.arxiv else ""
        rows.append(f"| {i} | `{e.slug}` | {e.short}{arxiv} | {e.area} | `{e.code}` | {e.status} | "
                    f"{e.paper_result.replace('|', '/')} | {e.ours.replace('|', '/') or '-'} |")
    return "\n".join(rows)


def cmd_catalog(args) -> int:
    if args.markdown:
        print(markdown_table())
    else:
        for e in catalog.CATALOG:
            print(f"{e.slug}: {e.title} [{e.status}]")
    return 0


def _parse_slugs(spec: str) -> list[str]:
    if spec == "all":
        return registry.implemented_slugs()
    slugs = [s.strip() for s in spec.split(",") if s.strip()]
    for s in slugs:
        registry.get(s)  # raises with a clear message for unknown or planned slugs
    return slugs


def cmd_run(args, overrides: list[str]) -> int:
    from experiments import report

    slugs = _parse_slugs(args.slug)
    if overrides and len(slugs) != 1:
        raise SystemExit(f"config overrides {overrides} need exactly one slug; got {slugs}")
    results = []
    for slug in slugs:
        exp = registry.get(slug)
        cfg = exp.config(args.preset)
        if overrides:
            import tyro

            cfg = tyro.cli(exp.config_cls, args=overrides, default=cfg, prog=f"python -m experiments run {slug}")
        print(f"==> {slug} [{args.preset}]", flush=True)
        result = report.run_experiment(slug, args.preset, results_dir=args.results_dir, config=cfg,
                                       workdir=args.workdir)
        mark = {True: "reproduced", False: "NOT reproduced", None: "no verdict"}[result["reproduced"]]
        print(f"    {mark}: {result['verdict']}  ({result['wall_s']} s)", flush=True)
        results.append(result)
    path = report.write_report(args.results_dir)
    print(f"report: {path}")
    return 0


def cmd_report(args) -> int:
    from experiments import report

    print(report.write_report(args.results_dir))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list every paper and experiment with its status")
    p_cat = sub.add_parser("catalog", help="print the paper catalog")
    p_cat.add_argument("--markdown", action="store_true", help="as the README's markdown table")
    p_run = sub.add_parser("run", help="run experiments: a slug, a comma list, or 'all'",
                           epilog="Arguments after the slug that this parser does not know are config "
                                  "field overrides, e.g. --num-steps 100.")
    p_run.add_argument("slug")
    p_run.add_argument("--preset", default="quick", choices=registry.PRESETS)
    p_run.add_argument("--results-dir", default="results")
    p_run.add_argument("--workdir", default=None, help="override the run directory (default results/<slug>/<preset>)")
    sub.add_parser("bench", help="run the benchmarks (kernels and models); options: bench --help", add_help=False)
    p_rep = sub.add_parser("report", help="rebuild results/REPORT.md from result files")
    p_rep.add_argument("--results-dir", default="results")

    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        from experiments import bench

        bench.main(rest)
        return 0
    if args.command != "run" and rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        if args.command == "list":
            return cmd_list(args)
        if args.command == "catalog":
            return cmd_catalog(args)
        if args.command == "run":
            return cmd_run(args, rest)
        return cmd_report(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
