# The two commands of the README's quick start. Each creates .venv when missing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Eight simulated CPU devices so sharded code paths run anywhere. A plain `python -m experiments run`
# has 1 device: every result.json (`devices`), summary line and REPORT.md row shows the count, so compare
# throughput numbers only between runs with the same count.
export XLA_FLAGS ?= --xla_force_host_platform_device_count=8
# A comma list of slugs for `make reproduce PAPERS=vegas,ffd`; default all implemented.
PAPERS ?= all
PRESET ?= quick
# Experiments run at once by `make reproduce`, each in its own process (most keep about one core busy).
JOBS ?= 2
# pytest-xdist workers: one per core.
WORKERS ?= auto

.PHONY: test reproduce install clean-venv

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	touch $@

install: $(VENV)/.installed

# libtpu for the TPU ahead-of-time compile tests (tests/pallas_kernels/aot_compile_test.py); without it
# (no network, another platform) those tests skip and say why.
$(VENV)/.installed-tpu: $(VENV)/.installed
	$(PY) -m pip install --quiet -e ".[tpu]" || echo "libtpu not installed: the TPU compile tests will skip"
	touch $@

test: $(VENV)/.installed-tpu
	$(PY) -m pytest -n $(WORKERS) --dist loadfile -q --durations=30

# The quick preset updates the tracked results/REPORT.md; other presets write results/REPORT-<preset>.md.
reproduce: $(VENV)/.installed
	$(PY) -m experiments run $(PAPERS) --preset $(PRESET) --jobs $(JOBS)

clean-venv:
	rm -rf $(VENV)
