"""Test setup shared by the whole suite.

Eight simulated CPU devices, so sharded code paths run on any machine. The
flag must be set before JAX initializes its backends; `make test` also sets it
in the environment.
"""

import os

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
# The suite's time is almost all XLA compiling small CPU programs (a toast smoke run: 63 compiles, 38 s of
# its 49 s). LLVM's backend optimizations are most of each compile and buy nothing at test shapes: at level 0
# the same HLO (XLA's own passes and fusion decisions are unchanged) compiles about a third faster. XLA's CPU
# backend is not fast-math, so results are the same floats (the smoke metrics compared bit for bit).
# Set the flag yourself to test at another level.
if "--xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
# Three more compile-time options, measured on toast's smoke run (63 compiles; backend compile 21 s -> 7-9 s,
# weightclip's 200 compiles 14 -> 8 s): XLA's older elemental emitters instead of the MLIR fusion emitters
# (which cost most of what level 0 leaves), no YNNPACK fusions of elementwise chains around dots, and one LLVM
# module per program instead of parallel codegen threads (two xdist workers already fill two cores). They
# change how a program is emitted, not its maths: floats may differ in the last bits (smoke metrics agreed to
# about 1e-7 relative), and the suite passes the same with and without them.
# XLA aborts on a flag it does not know, so they are added only for the jaxlib they were measured on.
_FAST_COMPILE_FLAGS = ("--xla_cpu_use_fusion_emitters=false", "--xla_cpu_experimental_ynn_fusion_type=",
                       "--xla_cpu_parallel_codegen_split_count=1")
try:
    from importlib.metadata import PackageNotFoundError, version

    _JAXLIB = version("jaxlib")
except PackageNotFoundError:  # no metadata: leave the flags out
    _JAXLIB = ""
if _JAXLIB.startswith("0.10."):
    for _flag in _FAST_COMPILE_FLAGS:
        if _flag.split("=")[0] not in os.environ["XLA_FLAGS"]:
            os.environ["XLA_FLAGS"] += " " + _flag
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("MPLBACKEND", "Agg")
# One persistent compilation cache for the xdist workers, the doctests and the notebook kernels (which
# inherit the environment), so a program compiled in one process is loaded, not recompiled, in another.
# It lives in the checkout (git-ignored), so a clean clone, as in CI, starts cold.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(os.path.dirname(os.path.dirname(__file__)), ".jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Hardware-marked tests are skipped unless that hardware is present."""
    import jax

    backend = jax.default_backend()
    for item in items:
        for marker in ("gpu", "tpu"):
            if marker in item.keywords and backend != marker:
                item.add_marker(pytest.mark.skip(reason=f"needs a {marker.upper()}"))


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drops JAX's in-process caches of traced and compiled programs after each test module.

    A worker runs hundreds of modules; without this it holds every program it ever compiled (5+ GB
    per xdist worker by the end of the suite), and in cold-cache runs a worker segfaulted inside XLA's
    CPU compiler late in the run. Programs a later module needs again load from the persistent cache.
    """
    yield
    import gc

    import jax

    jax.clear_caches()
    gc.collect()
