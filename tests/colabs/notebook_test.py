"""Notebooks: the .ipynb is in sync with its jupytext source and runs in smoke mode."""

import os
import pathlib

import jupytext
import nbformat
import pytest

COLABS = pathlib.Path(__file__).resolve().parents[2] / "colabs"
SOURCES = sorted(COLABS.glob("*.py"))


def _code_cells(nb):
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_ipynb_is_paired_and_has_no_outputs(source):
    ipynb = source.with_suffix(".ipynb")
    assert ipynb.exists(), f"{ipynb.name} missing: run `jupytext --to ipynb {source.name}`"
    paired = nbformat.read(ipynb, as_version=4)
    assert _code_cells(paired) == _code_cells(jupytext.read(source)), (
        f"{ipynb.name} differs from {source.name}: run `jupytext --sync colabs/{source.name}`")
    for cell in paired.cells:
        if cell.cell_type == "code":
            assert not cell.get("outputs"), f"{ipynb.name} has stored outputs; clear them"


@pytest.mark.notebook
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_notebook_runs_in_smoke_mode(source, tmp_path, monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.setenv("SMOKE", "1")
    root = str(COLABS.parent)
    monkeypatch.setenv("PYTHONPATH", root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    nb = nbformat.read(source.with_suffix(".ipynb"), as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
