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
