"""Imports flow one way: primitives <- pallas_kernels <- models <- algorithms <- experiments.

Every module of the five packages is parsed (not imported) and each `import` / `from ... import`
of a library package is checked against that order, so an upward edge (e.g. a kernel benchmark
importing the model stack) fails here with the file and line that adds it.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
ORDER = ("primitives", "pallas_kernels", "models", "algorithms", "experiments")


def _imported_packages(path: pathlib.Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top in ORDER:
                yield top, node.lineno


@pytest.mark.parametrize("package", ORDER)
def test_no_upward_imports(package):
    allowed = set(ORDER[: ORDER.index(package) + 1])
    bad = [f"{path.relative_to(ROOT)}:{line} imports {top}"
           for path in sorted((ROOT / package).rglob("*.py"))
           for top, line in _imported_packages(path) if top not in allowed]
    assert not bad, f"{package} may import only {sorted(allowed)}; found:\n" + "\n".join(bad)
