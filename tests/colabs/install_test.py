"""The quickstart's install cell: installs the library without replacing an installed jax/jaxlib.

The cell's source is taken from ``colabs/quickstart.py`` (the notebook's source of truth) and run

- in-process with ``subprocess.run`` replaced, to check the pip command and the constraints file it
  writes (runs everywhere, no pip);
- in fresh Colab-like venvs under ``tmp_path``, offline (``PIP_NO_INDEX``, a wheelhouse holding only
  local wheels, no pip config, no cache): one whose jax is this checkout's jax (the cell must keep it
  and the package must import from the venv), and one whose jax is a stand-in at 0.9.0, below the
  library's range (the cell must fail naming it and leave it in place, where pip without the
  constraint would replace it).

The venvs see this checkout's installed dependencies through a ``.pth`` file pointing at a folder of
symlinks to ``.venv``'s site-packages (without the editable ``icml26-methods``), as Colab's
preinstalled packages are seen; only the package itself is built and installed. Building needs a
setuptools>=77 wheel on local disk (this machine's wheel folders); without one the venv tests skip.
"""

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "colabs" / "quickstart.py"
PACKAGES = ("primitives", "models", "algorithms", "pallas_kernels", "experiments")
# Local wheel folders on this project's machines; nothing here is fetched from a network.
WHEEL_DIRS = ("/opt/wheels", "/opt/pypi/files", "/opt/pypi-more/files", "/usr/share/python-wheels")


def _install_cell() -> str:
    cells = [c.source for c in jupytext.read(QUICKSTART).cells
             if c.cell_type == "code" and "ICML26_REPO_URL" in c.source]
    assert len(cells) == 1, f"expected one install cell in {QUICKSTART.name}, found {len(cells)}"
    return cells[0]


# --- the cell's logic, pip replaced ---------------------------------------------------------------


class _FakeRun:
    def __init__(self, returncode=0, stderr=""):
        self.calls, self.returncode, self.stderr = [], returncode, stderr

    def __call__(self, cmd, **kwargs):
        constraints = Path(cmd[cmd.index("-c") + 1]).read_text()
        self.calls.append((cmd, constraints))
        return subprocess.CompletedProcess(cmd, self.returncode, stdout="", stderr=self.stderr)


def _exec_cell(monkeypatch, url, fake):
    if url is None:
        monkeypatch.delenv("ICML26_REPO_URL", raising=False)
    else:
        monkeypatch.setenv("ICML26_REPO_URL", url)
    monkeypatch.setattr(subprocess, "run", fake)
    exec(compile(_install_cell(), str(QUICKSTART), "exec"), {"__name__": "__main__"})


@pytest.mark.parametrize("url, source", [
    ("https://github.com/OWNER/REPO.git", "git+https://github.com/OWNER/REPO.git"),
    ("git+https://github.com/OWNER/REPO.git@main", "git+https://github.com/OWNER/REPO.git@main"),
    ("/content/icml26", "/content/icml26"),
    ("https://example.org/icml26_methods-0.1.0-py3-none-any.whl", "https://example.org/icml26_methods-0.1.0-py3-none-any.whl"),
])
def test_cell_pins_installed_jax_and_jaxlib(monkeypatch, url, source):
    fake = _FakeRun()
    _exec_cell(monkeypatch, url, fake)
    [(cmd, constraints)] = fake.calls
    assert cmd[:3] == [sys.executable, "-m", "pip"] and cmd[3] == "install" and cmd[-1] == source
    expected = {f"jax=={importlib.metadata.version('jax')}", f"jaxlib=={importlib.metadata.version('jaxlib')}"}
    assert set(constraints.split()) == expected


def test_cell_reports_pip_failure(monkeypatch):
    fake = _FakeRun(returncode=1, stderr="ResolutionImpossible: icml26-methods depends on jax>=0.10.2")
    with pytest.raises(RuntimeError, match=r"(?s)keeping the installed jax==.*outside the library's range.*"
                                           r"ResolutionImpossible"):
        _exec_cell(monkeypatch, "/content/icml26", fake)


def test_cell_without_url_installs_nothing(monkeypatch):
    fake = _FakeRun()
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    _exec_cell(monkeypatch, None, fake)
    assert fake.calls == []
    monkeypatch.setitem(sys.modules, "google.colab", type(sys)("google.colab"))  # on Colab, library importable
    _exec_cell(monkeypatch, None, fake)
    assert fake.calls == []
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)  # on Colab, library missing
    with pytest.raises(RuntimeError, match="Set REPO_URL at the top of this cell"):
        _exec_cell(monkeypatch, None, fake)


# --- the cell in fresh venvs, offline ---------------------------------------------------------------


def _local_wheel(name: str, version_ok) -> Path | None:
    """The newest wheel of `name` in the local wheel folders whose version passes `version_ok`."""
    found = []
    for folder in WHEEL_DIRS:
        for wheel in Path(folder).glob(f"{name}-*.whl") if Path(folder).is_dir() else ():
            version = tuple(int(p) for p in re.findall(r"\d+", wheel.name.split("-")[1])[:3])
            if version_ok(version):
                found.append((version, wheel))
    return max(found)[1] if found else None


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """A wheelhouse of local wheels, a copy of the package source, and the preinstalled-packages folder."""
    setuptools_wheel = _local_wheel("setuptools", lambda v: v >= (77,))
    if setuptools_wheel is None:
        pytest.skip(f"no setuptools>=77 wheel in {WHEEL_DIRS} to build the package offline")
    root = tmp_path_factory.mktemp("colab")
    wheels = root / "wheels"
    wheels.mkdir()
    (wheels / setuptools_wheel.name).symlink_to(setuptools_wheel)
    jax_version = importlib.metadata.version("jax")
    jax_wheel = _local_wheel("jax", lambda v: ".".join(map(str, v)) == jax_version)
    if jax_wheel is not None:  # lets pip *replace* a stand-in jax unless the cell's constraint stops it
        (wheels / jax_wheel.name).symlink_to(jax_wheel)

    src = root / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))

    site = Path(sysconfig.get_paths()["purelib"])
    preinstalled = root / "preinstalled"
    preinstalled.mkdir()
    for entry in site.iterdir():
        if not re.match(r"(icml26|__editable__|__pycache__)|.*\.pth$", entry.name):
            (preinstalled / entry.name).symlink_to(entry)
    return dict(root=root, wheels=wheels, src=src, preinstalled=preinstalled, jax_wheel=jax_wheel)


def _venv(offline, name: str, hide=()) -> tuple[Path, Path]:
    """A fresh venv that sees the preinstalled folder (less the top-level names in `hide`)."""
    venv = offline["root"] / name
    subprocess.run([os.path.join(sys.base_prefix, "bin", "python3"), "-m", "venv", "--without-pip", str(venv)],
                   check=True)
    python = venv / "bin" / "python"
    venv_site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                    check=True, capture_output=True, text=True).stdout.strip())
    seen = offline["preinstalled"]
    if hide:
        seen = offline["root"] / f"{name}-preinstalled"
        seen.mkdir()
        for entry in offline["preinstalled"].iterdir():
            if not any(entry.name == h or entry.name.startswith(h + "-") for h in hide):
                (seen / entry.name).symlink_to(entry.resolve())
    (venv_site / "zz_preinstalled.pth").write_text(f"{seen}\n")
    return python, venv_site


def _env(offline, url: str | None) -> dict:
    env = {"PATH": os.environ["PATH"], "HOME": str(offline["root"]), "PIP_CONFIG_FILE": os.devnull,
           "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(offline["wheels"]), "PIP_NO_CACHE_DIR": "1",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONNOUSERSITE": "1"}
    if url is not None:
        env["ICML26_REPO_URL"] = url
    return env


_PROBE = """
import importlib.metadata as m, json, sys
out = {"jax": m.version("jax")}
try:
    import jax, primitives, models, experiments
    out.update(jax_file=jax.__file__, package=m.version("icml26-methods"), primitives_file=primitives.__file__)
except ImportError as err:
    out["import_error"] = str(err)
print(json.dumps(out))
"""


def _probe(python, offline) -> dict:
    done = subprocess.run([python, "-c", _PROBE], cwd=offline["root"], env=_env(offline, None),
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_cell_installs_package_and_keeps_jax(offline):
    python, venv_site = _venv(offline, "venv_in_range")
    before = _probe(python, offline)
    assert "import_error" in before and before["jax"] == importlib.metadata.version("jax")
    cell = offline["root"] / "install_cell.py"
    cell.write_text(_install_cell())
    done = subprocess.run([python, str(cell)], cwd=offline["root"], env=_env(offline, str(offline["src"])),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"keeping jax=={before['jax']}" in done.stdout
    after = _probe(python, offline)
    assert "import_error" not in after, after
    assert after["jax"] == before["jax"] and Path(after["jax_file"]).parent.parent == offline["preinstalled"]
    assert after["package"] == "0.1.0" and Path(after["primitives_file"]).is_relative_to(venv_site)
    assert not list(venv_site.glob("jax-*.dist-info")) and not list(venv_site.glob("jaxlib-*.dist-info"))


def test_cell_refuses_to_replace_out_of_range_jax(offline):
    python, venv_site = _venv(offline, "venv_old_jax", hide=("jax",))
    (venv_site / "jax").mkdir()
    (venv_site / "jax" / "__init__.py").write_text('__version__ = "0.9.0"\n')
    info = venv_site / "jax-0.9.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: jax\nVersion: 0.9.0\n")
    (info / "RECORD").write_text("jax/__init__.py,,\njax-0.9.0.dist-info/METADATA,,\njax-0.9.0.dist-info/RECORD,,\n")
    (info / "INSTALLER").write_text("pip\n")
    if offline["jax_wheel"] is not None:  # control: without the cell's constraint pip would replace it
        dry = subprocess.run([python, "-m", "pip", "install", "--dry-run", str(offline["src"])],
                             cwd=offline["root"], env=_env(offline, None), capture_output=True, text=True, timeout=300)
        assert re.search(r"Would install .*\bjax-\d", dry.stdout), dry.stdout + dry.stderr
    cell = offline["root"] / "install_cell.py"
    cell.write_text(_install_cell())
    done = subprocess.run([python, str(cell)], cwd=offline["root"], env=_env(offline, str(offline["src"])),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "RuntimeError: pip could not install" in done.stderr and "jax==0.9.0" in done.stderr, done.stderr
    after = _probe(python, offline)
    assert after["jax"] == "0.9.0" and (info / "METADATA").exists()
    assert not list(venv_site.glob("icml26_methods-*.dist-info"))
