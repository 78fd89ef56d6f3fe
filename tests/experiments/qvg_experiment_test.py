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
    c = dataclasses.replace(exp.EXPERIMENT.config("smoke"), eval_videos=2)
    return exp._Runner(c, VideoTransformer(exp._model_cfg(c), rngs=nnx.Rngs(0)))


def test_only_frames_after_the_span_is_quantized_differ_from_full_precision(runner):
    c = runner.c
    videos = exp._videos(c, 1, c.eval_videos, c.context_frames + c.gen_frames)
    key = jax.random.key(0)
    ref, _ = runner.rollout(videos, None, key)
    got, caches = runner.rollout(videos, qvg.baseline_quantizer("rtn", bits=2, group_size=32), key)
    assert caches[0].layout()[:c.quant_factor] == ["Q0"] * c.quant_factor
    np.testing.assert_allclose(got[:, 0], ref[:, 0], atol=1e-6)  # computed before the span was quantized
    assert np.abs(got[:, 1] - ref[:, 1]).max() > 1e-4           # reads the quantized span


def test_full_precision_rollout_matches_the_teacher_forced_pass_on_context(runner):
    c = runner.c
    videos = exp._videos(c, 1, c.eval_videos, c.context_frames + c.gen_frames)
    gen, _ = runner.rollout(videos, None, jax.random.key(0))
    pred, _ = runner.forward(runner.params, videos[:, :c.context_frames])
    np.testing.assert_allclose(gen[:, 0], pred[:, -1], atol=2e-5)


def test_family_value_at_equal_bits():
    pts = [(2.0, 1.0), (3.0, 0.5), (4.0, 0.1)]
    assert exp._at_bits(pts, 2.5) == pytest.approx(0.75)
    assert exp._at_bits(pts, 1.5) == 1.0   # no point at or below: the cheapest one (favours the baseline)
    assert exp._at_bits(pts, 5.0) == 0.1
