"""QVG experiment internals: the frame that cannot read the quantized span, and the equal-bits rule."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from algorithms.compression import qvg
from experiments import qvg as exp
from models.video import VideoTransformer


@pytest.fixture(scope="module")
def runner():
    smoke = exp.EXPERIMENT.config("smoke")
    c = dataclasses.replace(smoke, eval=dataclasses.replace(smoke.eval, videos=2))
    return exp._Runner(c, VideoTransformer(exp._model_cfg(c), rngs=nnx.Rngs(0)))


def test_only_frames_after_the_span_is_quantized_differ_from_full_precision(runner):
    c = runner.c
    videos = exp._videos(c, 1, c.eval.videos, c.eval.context_frames + c.eval.gen_frames)
    key = jax.random.key(0)
    ref, _ = runner.rollout(videos, None, key)
    got, caches = runner.rollout(videos, qvg.baseline_quantizer("rtn", bits=2, group_size=32), key)
    assert caches[0].layout()[:c.eval.quant_factor] == ["Q0"] * c.eval.quant_factor
    np.testing.assert_allclose(got[:, 0], ref[:, 0], atol=1e-6)  # computed before the span was quantized
    assert np.abs(got[:, 1] - ref[:, 1]).max() > 1e-4           # reads the quantized span


def test_full_precision_rollout_matches_the_teacher_forced_pass_on_context(runner):
    c = runner.c
    videos = exp._videos(c, 1, c.eval.videos, c.eval.context_frames + c.eval.gen_frames)
    gen, _ = runner.rollout(videos, None, jax.random.key(0))
    pred, _ = runner.forward(runner.params, videos[:, :c.eval.context_frames])
    np.testing.assert_allclose(gen[:, 0], pred[:, -1], atol=2e-5)


def test_family_value_at_equal_bits():
    pts = [(2.0, 1.0), (3.0, 0.5), (4.0, 0.1)]
    assert exp._at_bits(pts, 2.5) == pytest.approx(0.75)
    assert exp._at_bits(pts, 1.5) == 1.0   # no point at or below: the cheapest one (favours the baseline)
    assert exp._at_bits(pts, 5.0) == 0.1


def test_training_fingerprint_is_the_flat_repr_and_follows_every_section():
    """Checkpoints written before the config had sections keep resuming: the fingerprint keeps the flat names."""
    c = exp.EXPERIMENT.config("quick")
    fp = exp._fingerprint(c)
    assert fp.startswith("Config(size=32, patch=4, num_shapes=3, speed=1.0, noise=0.0, d_model=64, num_heads=1, ")
    assert ", train_frames=20, batch_size=2, train_steps=400, learning_rate=0.001, eval_videos=4, " in fp
    assert fp.endswith(", ablate_noise=(0.0, 0.05, 0.1, 0.2), seed=0, checkpoint=True, progress=True)")
    for section, field, value in (("video", "speed", 2.0), ("model", "d_model", 32), ("train", "steps", 10),
                                  ("eval", "videos", 2), ("quant", "bits", (2,)), ("ablate", "stages", (1,))):
        changed = dataclasses.replace(c, **{section: dataclasses.replace(getattr(c, section), **{field: value})})
        assert exp._fingerprint(changed) != fp, (section, field)
