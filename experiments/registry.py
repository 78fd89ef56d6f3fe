"""The experiment registry: slug -> presets, config type and `run`.

Every runnable experiment is a module `experiments/<slug>.py` defining

    EXPERIMENT = Experiment(slug=..., config_cls=Config,
                            presets={"smoke": ..., "quick": ..., "paper": ...},
                            run=run)

where `Config` is a frozen dataclass, each preset is a zero-argument function
returning a `Config`, and `run(config, workdir) -> dict` returns at least
`{"metrics": {...}, "verdict": str, "reproduced": bool | None}` (and optionally
`"plots": [file names in workdir]`). Papers are listed in `experiments.catalog`;
foundation experiments that are not papers (such as `lm_arithmetic`) are listed
in `FOUNDATION`. Modules are imported lazily, so `python -m experiments list`
stays fast.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math
import pathlib
from typing import Any, Callable, Mapping

from experiments.catalog import CATALOG, CatalogEntry

__all__ = ["Experiment", "FOUNDATION", "PRESETS", "ConfigError", "all_slugs", "implemented_slugs", "get", "catalog_entry",
           "check_config", "cli_flag"]

PRESETS = ("smoke", "quick", "paper")

# Experiments that check the library itself rather than reproduce a paper.
FOUNDATION: dict[str, str] = {
    "lm_arithmetic": "Tiny decoder LM learns multi-digit arithmetic (foundation check)",
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Experiment:
    """A registered experiment.

    Attributes:
      slug: the module name and CLI name.
      config_cls: the frozen dataclass type of its config.
      presets: preset name -> zero-argument function returning a config.
        Must define "smoke" (seconds; run by the tests), "quick" (CPU minutes;
        run by `make reproduce`) and "paper" (the paper's scale); may define
        study presets that settle one question (run by name, e.g.
        ``run nmars --preset diff_study``; results in <slug>/<preset>/, no REPORT).
      run: `run(config, workdir: pathlib.Path) -> dict` (see module docstring).
      claim: the claim checked, for experiments outside the catalog (papers
        take theirs from the catalog).
      train_step: optional ``train_step(config) -> experiments.aot.TrainStep``, the model, optimizer and
        batch of the run's main training step, which ``python -m experiments aot <slug>`` compiles for a
        TPU slice ahead of time.
    """

    slug: str
    config_cls: type
    presets: Mapping[str, Callable[[], Any]]
    run: Callable[[Any, pathlib.Path], dict]
    claim: str = ""
    train_step: Callable[[Any], Any] | None = None

    def __post_init__(self):
        missing = [p for p in PRESETS if p not in self.presets]
        if missing:
            raise ValueError(f"experiment {self.slug!r} must define presets {list(PRESETS)}; missing {missing}")

    def config(self, preset: str):
        """The config of a preset; ValueError naming the preset if unknown."""
        if preset not in self.presets:
            raise ValueError(f"unknown preset {preset!r} for {self.slug!r}; choose from {sorted(self.presets)}")
        cfg = self.presets[preset]()
        if not isinstance(cfg, self.config_cls):
            raise TypeError(f"preset {preset!r} of {self.slug!r} returned {type(cfg).__name__}, "
                            f"expected {self.config_cls.__name__}")
        return cfg

    @property
    def paper(self) -> CatalogEntry | None:
        return catalog_entry(self.slug)

    @property
    def title(self) -> str:
        entry = self.paper
        return entry.title if entry else FOUNDATION.get(self.slug, self.slug)

    @property
    def paper_claim(self) -> str:
        entry = self.paper
        return entry.claim if entry else self.claim


class ConfigError(ValueError):
    """A config field holds a value no experiment can run with.

    Attributes:
      field: the field's dotted path in the config (``num_steps``, ``model.d_model``); the CLI
        shows it as the flag the user typed (:func:`cli_flag`).
    """

    def __init__(self, field: str, message: str):
        super().__init__(f"{field} {message}")
        self.field = field
        self.message = message


def cli_flag(field: str) -> str:
    """The command-line flag of a config field path: ``model.d_model`` -> ``--model.d-model`` (tyro's spelling)."""
    return "--" + field.replace("_", "-")


def flat_fields(config: Any, fields, *, skip=(), replace=None) -> dict[str, Any]:
    """A config split into sections seen as the flat config it replaced: ``{old_name: value}``.

    `fields` holds ``(old_name, dotted_path)`` pairs (``("train_steps", "train.steps")``) in the old field
    order; names in `skip` are left out and `replace` overrides values by old name. Experiments build their
    checkpoint fingerprints and cache keys from this, so runs written before the split stay valid.
    """
    replace = replace or {}
    out = {}
    for old, path in fields:
        if old in skip:
            continue
        value = config
        for part in path.split("."):
            value = getattr(value, part)
        out[old] = replace.get(old, value)
    return out


def flat_repr(config: Any, fields, *, replace=None) -> str:
    """``Config(size=32, patch=4, ...)``: the repr the flat config had (see `flat_fields`)."""
    return "Config(" + ", ".join(f"{k}={v!r}" for k, v in flat_fields(config, fields, replace=replace).items()) + ")"


# Field names checked for every experiment (leaf names, also inside nested config dataclasses).
_POSITIVE_INT_NAMES = ("num_steps", "train_steps", "batch_size", "batch")
_POSITIVE_INT_SUFFIXES = ("_batch_size", "_batch")
_LEARNING_RATE_NAMES = ("learning_rate", "lr")
_LEARNING_RATE_SUFFIXES = ("_learning_rate", "_lr")


def _floats(value: Any):
    if isinstance(value, float):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _floats(v)


def check_config(config: Any, *, _prefix: str = "") -> None:
    """Checks the fields every experiment shares, in any config dataclass (nested ones too).

    The shared rules (an experiment's own ``__post_init__`` checks the rest):

      * no float field (or float inside a tuple field) is NaN;
      * learning rates (``learning_rate``, ``lr``, ``*_lr``, ``*_learning_rate``) are finite and > 0;
      * step and batch counts (``num_steps``, ``train_steps``, ``batch_size``, ``batch``,
        ``*_batch_size``, ``*_batch``) are >= 1; a count field whose default is 0 (a sentinel, such as
        sysr's ``run_batch_size=0``: all runs in one call) may also be 0.

    Raises:
      ConfigError: (a ValueError) naming the field's dotted path, the rule and the value.
    """
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"config must be a dataclass instance; got {type(config).__name__}")
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        path = f"{_prefix}{f.name}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            check_config(value, _prefix=f"{path}.")
            continue
        if any(math.isnan(v) for v in _floats(value)):
            raise ConfigError(path, f"must not be NaN; got {value!r}")
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if is_number and (f.name in _LEARNING_RATE_NAMES or f.name.endswith(_LEARNING_RATE_SUFFIXES)):
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(path, f"(a learning rate) must be finite and > 0; got {value!r}")
        if (isinstance(value, int) and not isinstance(value, bool)
                and (f.name in _POSITIVE_INT_NAMES or f.name.endswith(_POSITIVE_INT_SUFFIXES))):
            lowest = 0 if f.default == 0 and not isinstance(f.default, bool) else 1
            if value < lowest:
                raise ConfigError(path, f"must be >= {lowest}; got {value!r}")


def catalog_entry(slug: str) -> CatalogEntry | None:
    for entry in CATALOG:
        if entry.slug == slug:
            return entry
    return None


def all_slugs() -> list[str]:
    """Foundation experiments first, then the 38 papers in catalog order."""
    return list(FOUNDATION) + [e.slug for e in CATALOG]


def _has_module(slug: str) -> bool:
    return importlib.util.find_spec(f"experiments.{slug}") is not None


def implemented_slugs() -> list[str]:
    """Slugs whose experiment module exists."""
    return [s for s in all_slugs() if _has_module(s)]


def get(slug: str) -> Experiment:
    """The registered experiment for `slug`; ValueError naming it if there is none."""
    known = all_slugs()
    if slug not in known:
        close = [s for s in known if slug.lower() in s or s in slug.lower()]
        hint = f" Did you mean {close}?" if close else ""
        raise ValueError(f"unknown experiment slug {slug!r}.{hint} Known slugs: {', '.join(known)}")
    if not _has_module(slug):
        entry = catalog_entry(slug)
        where = f" (issue {entry.issue})" if entry and entry.issue else ""
        raise ValueError(f"experiment {slug!r} is in the catalog but not implemented yet{where}; "
                         f"implemented: {', '.join(implemented_slugs())}")
    module = importlib.import_module(f"experiments.{slug}")
    exp = getattr(module, "EXPERIMENT", None)
    if not isinstance(exp, Experiment) or exp.slug != slug:
        raise TypeError(f"experiments/{slug}.py must define EXPERIMENT = Experiment(slug={slug!r}, ...)")
    return exp
