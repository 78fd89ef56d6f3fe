"""Every Pallas kernel compiles with the real TPU compiler (Mosaic) for v5e and v6e at production shapes.

Cases and the known failures live in `pallas_kernels.aot` (issue 35). Needs libtpu (the ``[tpu]``
extra, which `make test` installs); without it every case skips, saying so. A case in
`aot.KNOWN_FAILURES` must still fail (strict): once a kernel fix makes it compile, take it off the table.
"""

import re

import pytest

from pallas_kernels import aot

needs_libtpu = pytest.mark.skipif(not aot.libtpu_available(),
                                  reason='libtpu not installed: pip install -e ".[tpu]" to compile for TPU')
PARAMS = [pytest.param(case, topo, id=f"{case.id}-{topo.split(':')[0]}") for case in aot.CASES for topo in aot.TOPOLOGIES]


def test_every_kernel_package_has_a_production_case():
    import pkgutil

    import pallas_kernels

    packages = {m.name for m in pkgutil.iter_modules(pallas_kernels.__path__) if m.ispkg}
    assert {c.kernel for c in aot.CASES} == packages
    ids = {c.id for c in aot.CASES}
    assert {case for case, _ in aot.KNOWN_FAILURES} <= ids and set(aot.EXPECTED_ERRORS) <= ids
    assert set(aot.TEMP_BUDGETS_MIB) <= ids


@needs_libtpu
@pytest.mark.parametrize("case, topology", PARAMS)
def test_compiles_for_tpu(case, topology):
    gen = topology.split(":")[0]
    result = aot.compile_case(case, topology)
    if case.id in aot.EXPECTED_ERRORS:
        assert not result["ok"] and re.search(aot.EXPECTED_ERRORS[case.id], result["error"]), result
    elif (case.id, gen) in aot.KNOWN_FAILURES:
        assert not result["ok"], (f"{case.id} now compiles on {gen}: remove it from aot.KNOWN_FAILURES "
                                  f"({result})")
        assert "RESOURCE_EXHAUSTED" in result["error"], result  # still the known cause, not a new error
    else:
        assert result["ok"], f"{case.id} does not compile on {gen}: {result['error']}"
        budget = aot.TEMP_BUDGETS_MIB.get(case.id, aot.TEMP_BUDGET_MIB)
        assert 0 <= result["temp_bytes"] <= budget * 2**20, (
            f"{case.id} on {gen} needs {result['temp_bytes'] / 2**20:.1f} MiB of HBM temporaries, over its "
            f"budget of {budget} MiB (aot.TEMP_BUDGETS_MIB): a copy or relayout in its wrapper?")
