"""Fixtures shared by the experiment tests: TFDS's offline mock data (the ``[data]`` extra, skipped without it)."""

import pytest

TFDS_SKIP = "tensorflow-datasets is not installed (the [data] extra; CI installs only [test])"


@pytest.fixture(scope="module")
def tfds():
    return pytest.importorskip("tensorflow_datasets", reason=TFDS_SKIP)


@pytest.fixture
def mocked_tfds(tfds, monkeypatch):
    """TFDS's mock data (6 random examples per split), with every builder reporting itself prepared.

    Nothing is downloaded or read from disk: ``tfds.testing.mock_data`` serves each split from its
    feature spec (CIFAR-10 and every CIFAR-10-C config: uint8 [32, 32, 3] images, labels 0..9).
    """
    monkeypatch.setattr(tfds.core.DatasetBuilder, "is_prepared", lambda self: True)
    with tfds.testing.mock_data(num_examples=6):
        yield tfds


@pytest.fixture
def compile_smoke_step():
    """``compile_smoke_step(slugs) -> (slug, step, row)``: the smallest smoke-preset training step among the
    experiments `slugs` (by parameter count; a preset whose `train_step` raises ValueError trains nothing and
    is left out), compiled for a v5e 2x2 slice fully sharded (`experiments.aot.compile_train_step`), with the
    checks every such compile shares: it compiles, fits, has 4 chips, the step's parameter count and batch.
    Skips, saying why, without libtpu."""
    import dataclasses

    import jax
    import numpy as np
    from flax import nnx

    from algorithms import training
    from experiments import aot, registry
    from pallas_kernels import aot as kernel_aot

    if not kernel_aot.libtpu_available():
        pytest.skip('libtpu is not installed (pip install -e ".[tpu]")')

    def compile_(slugs):
        steps = {}
        for slug in slugs:
            exp = registry.get(slug)
            try:
                steps[slug] = exp.train_step(exp.config("smoke"))
            except ValueError:  # this smoke preset trains nothing
                continue
        sizes = {slug: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(
            nnx.state(nnx.eval_shape(lambda s=step: s.build(nnx.Rngs(0))), nnx.Param))) for slug, step in steps.items()}
        slug = min(sizes, key=sizes.get)
        step = steps[slug]
        if step.batch_size % 4:  # the 4 chips of the slice shard the batch
            step = dataclasses.replace(step, batch_size=4 * -(-step.batch_size // 4))
        row = aot.compile_train_step(step, topology="v5e:2x2", mesh=training.MeshConfig(data=1, fsdp=-1, tensor=1))
        assert row["ok"] and row["fits"], (slug, row.get("error"))
        assert row["chips"] == 4 and row["params"] == sizes[slug] and row["batch_size"] == step.batch_size
        assert row["batch"] == {k: list(shape) for k, (shape, _) in step.batch_shapes().items()}
        assert 0 < row["total_bytes"] < row["hbm_bytes"] == 16 * 2**30
        return slug, step, row

    return compile_
