"""Video model: chunk-by-chunk steps with a (padded) KV history equal the teacher-forced pass."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.tasks import moving_shapes as ms
from models.video import VideoConfig, VideoTransformer, next_frame_loss

CFG = VideoConfig(patch_pixels=16, tokens_per_frame=16, max_frames=5, d_model=32, num_heads=2, num_layers=2)


@pytest.fixture(scope="module")
def model_and_clip():
    model = VideoTransformer(CFG, rngs=nnx.Rngs(0))
    clip = jnp.asarray(ms.patchify(ms.moving_shapes(0, num_videos=2, frames=5, size=16), 4))
    return model, clip


def test_steps_with_history_equal_the_teacher_forced_pass(model_and_clip):
    model, clip = model_and_clip
    pred, kvs = model(clip)
    history, capacity = None, 5 * 16
    for f in range(5):
        if f:
            # Padded to a fixed capacity with garbage past the valid length: it must be ignored.
            hist = [(jnp.concatenate([k[:, :f * 16], 1e3 * jnp.ones((2, capacity - f * 16, 2, 16))], axis=1),
                     jnp.concatenate([v[:, :f * 16], 1e3 * jnp.ones((2, capacity - f * 16, 2, 16))], axis=1))
                    for k, v in kvs]
            history = hist
        out, new = model.step(clip[:, f], f, history, f * 16 if f else None)
        np.testing.assert_allclose(out, pred[:, f], atol=2e-5)
        for (k, v), (kn, vn) in zip(kvs, new):
            np.testing.assert_allclose(kn, k[:, f * 16:(f + 1) * 16], atol=2e-5)


def test_loss_is_finite_and_decreases_with_a_few_adam_steps(model_and_clip):
    import optax
    model, clip = model_and_clip
    graphdef, params = nnx.split(model)
    opt = optax.adam(3e-3)
    state = opt.init(params)

    @jax.jit
    def step(params, state):
        loss, grads = jax.value_and_grad(lambda p: next_frame_loss(nnx.merge(graphdef, p), {"patches": clip})[0])(params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    losses = []
    for _ in range(15):
        params, state, loss = step(params, state)
        losses.append(float(loss))
    assert np.isfinite(losses).all() and losses[-1] < 0.5 * losses[0]


def test_bad_shapes_are_named(model_and_clip):
    model, _ = model_and_clip
    with pytest.raises(ValueError, match="patches must be"):
        model(jnp.zeros((1, 6, 16, 16)))
    with pytest.raises(ValueError, match="num_heads"):
        VideoConfig(patch_pixels=4, tokens_per_frame=4, max_frames=2, d_model=30, num_heads=4)


def test_moving_shapes_still_video_and_determinism():
    still = ms.moving_shapes(3, num_videos=2, frames=4, size=16, speed=0.0)
    assert np.all(still == still[:, :1])
    a = ms.moving_shapes(4, num_videos=1, frames=6, size=16)
    np.testing.assert_array_equal(a, ms.moving_shapes(4, num_videos=1, frames=6, size=16))
    assert not np.all(a == a[:, :1])  # shapes move at speed 1
    noisy = ms.moving_shapes(4, num_videos=1, frames=6, size=16, noise=0.1)
    assert 0.0 <= noisy.min() and noisy.max() <= 1.0 and not np.array_equal(noisy, a)
    with pytest.raises(ValueError, match="patch must divide"):
        ms.patchify(a, 5)
