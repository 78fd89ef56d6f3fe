"""PPM hybrid loss, baselines' losses, training, sampling and evaluation against brute force."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy import integrate, stats

from algorithms.forecasting import ppm as F
from models import ppm as M
from primitives import ddpm

RNG = np.random.default_rng(0)
KEY = jax.random.key(0, impl="rbg")


def _kde_ll_brute(samples, y, h):
    """Per-window mean over (t, c) of log( 1/(K h) sum_k phi((y - x_k) / h) ), float64."""
    b, k, t, c = samples.shape
    out = np.zeros(b)
    for i in range(b):
        tot = 0.0
        for j in range(t):
            for l in range(c):
                dens = np.mean(stats.norm.pdf(y[i, j, l], samples[i, :, j, l], h))
                tot += math.log(dens)
        out[i] = tot / (t * c)
    return out


@pytest.mark.parametrize("kernel", F.KERNELS)
def test_kernels_are_normalized_densities(kernel):
    f = lambda u: float(np.exp(np.asarray(F.kernel_log_density(jnp.float32(u), kernel, nu=5.0), np.float64)))
    mass = integrate.quad(f, -np.inf, np.inf, limit=200)[0]
    np.testing.assert_allclose(mass, 1.0, rtol=2e-4)
    ref = {"gaussian": stats.norm.pdf(0.7), "laplace": stats.laplace.pdf(0.7), "student_t": stats.t.pdf(0.7, 5),
           "cauchy": stats.cauchy.pdf(0.7), "logistic": stats.logistic.pdf(0.7)}[kernel]
    np.testing.assert_allclose(f(0.7), ref, rtol=1e-5)


def test_kde_log_likelihood_matches_brute_force_and_clamps():
    samples = RNG.normal(size=(3, 6, 4, 2)).astype(np.float32)
    y = RNG.normal(size=(3, 4, 2)).astype(np.float32)
    got = np.asarray(F.kde_log_likelihood(samples, y, bandwidth=0.3, clamp_min=None))
    np.testing.assert_allclose(got, _kde_ll_brute(samples, y, 0.3), rtol=1e-5, atol=1e-5)
    # far-away target: the mean log-likelihood is clamped at -25, so the NLL is 25
    far = F.kde_nll(samples, y + 100.0, bandwidth=0.3)
    np.testing.assert_allclose(float(far), 25.0, rtol=1e-6)


def test_kde_nll_with_one_sample_is_the_gaussian_nll_of_std_h():
    x = RNG.normal(size=(5, 1, 3, 2)).astype(np.float32)
    y = RNG.normal(size=(5, 3, 2)).astype(np.float32)
    want = -np.mean(stats.norm.logpdf(y, x[:, 0], 0.5))
    np.testing.assert_allclose(float(F.kde_nll(x, y, bandwidth=0.5)), want, rtol=1e-5)


def test_hybrid_loss_is_tau_nll_plus_mse_plus_beta_kl():
    samples = jnp.asarray(RNG.normal(size=(2, 5, 3, 2)), jnp.float32)
    y = jnp.asarray(RNG.normal(size=(2, 3, 2)), jnp.float32)
    mu = jnp.asarray(RNG.normal(size=(2, 2, 4)), jnp.float32)
    logvar = jnp.asarray(RNG.normal(size=(2, 2, 4)) * 0.5, jnp.float32)
    cfg = F.HybridLossConfig(tau=0.1, bandwidth=0.3, beta_kl=0.5, num_samples=5)
    loss, parts = jax.jit(lambda s, y, m, v: F.hybrid_loss(s, y, mu=m, logvar=v, config=cfg))(samples, y, mu, logvar)
    mse = np.mean((np.asarray(samples).mean(1) - np.asarray(y)) ** 2)
    m, lv = np.asarray(mu, np.float64), np.asarray(logvar, np.float64)
    kl = np.mean(0.5 * np.sum(np.exp(lv) + m ** 2 - 1.0 - lv, axis=-1))
    np.testing.assert_allclose(float(parts["mse"]), mse, rtol=1e-5)
    np.testing.assert_allclose(float(parts["kl"]), kl, rtol=1e-5)
    np.testing.assert_allclose(float(loss), 0.1 * float(parts["kde_nll"]) + mse + 0.5 * kl, rtol=1e-5)
    assert float(F.gaussian_kl(jnp.zeros(3), jnp.zeros(3))) == 0.0
    with pytest.raises(ValueError, match="beta_kl > 0 needs the prior's mu and logvar"):
        F.hybrid_loss(samples, y, config=cfg)


def test_baseline_losses_match_numpy():
    cfg = M.PPMConfig(seq_len=8, pred_len=3, d_model=4, d_ff=6)
    x = RNG.normal(size=(4, 8, 2)).astype(np.float32)
    y = RNG.normal(size=(4, 3, 2)).astype(np.float32)
    def both(loss_fn, model):  # (loss, outputs) in one compiled call
        return nnx.jit(lambda m, x, y: (loss_fn(m, x, y)[0], m(x)))(model, x, y)

    nll, (mean, std) = both(F.gaussian_nll_loss, M.GaussianMLP(cfg, rngs=nnx.Rngs(0)))
    want = -stats.norm.logpdf(y, np.asarray(mean, np.float64), np.asarray(std, np.float64)).mean()
    np.testing.assert_allclose(float(nll), want, rtol=1e-5)
    pin, q = both(F.pinball_loss, M.QuantileMLP(cfg, num_quantiles=4, rngs=nnx.Rngs(0)))
    tau = np.array([0.125, 0.375, 0.625, 0.875])[None, :, None, None]
    d = y[:, None] - np.asarray(q, np.float64)
    np.testing.assert_allclose(float(pin), np.mean(np.where(d >= 0, tau * d, (tau - 1) * d)), rtol=1e-5)
    mse, point = both(F.mse_loss, M.PointMLP(cfg, rngs=nnx.Rngs(0)))
    np.testing.assert_allclose(float(mse), np.mean((np.asarray(point, np.float64) - y) ** 2), rtol=1e-5)


def test_windows_seasonal_naive_bootstrap_and_kde_samples():
    series = np.arange(30, dtype=np.float32).reshape(15, 2)
    x, y = F.sliding_windows(series, seq_len=4, pred_len=2, stride=3)
    assert x.shape == (4, 4, 2) and y.shape == (4, 2, 2)
    np.testing.assert_array_equal(x[1], series[3:7])
    np.testing.assert_array_equal(y[1], series[7:9])
    xs = np.arange(12, dtype=np.float32).reshape(1, 6, 2)
    np.testing.assert_array_equal(np.asarray(F.seasonal_naive(xs, period=2, pred_len=5))[0],
                                  np.stack([xs[0, 4], xs[0, 5], xs[0, 4], xs[0, 5], xs[0, 4]]))
    point = np.zeros((3, 2, 2), np.float32)
    resid = np.arange(5 * 4, dtype=np.float32).reshape(5, 2, 2)
    bs = np.asarray(F.bootstrap_samples(KEY, point, resid, num_samples=6))
    assert bs.shape == (3, 6, 2, 2)
    assert all(any(np.array_equal(bs[i, k], r) for r in resid) for i in range(3) for k in range(6))
    base = jnp.zeros((400, 50, 1, 1))
    jit = np.asarray(F.kde_samples(KEY, base, bandwidth=0.3))
    np.testing.assert_allclose(jit.std(), 0.3, rtol=0.02)  # 20000 draws: s.e. of the std ~ 0.5%


def test_evaluate_matches_numpy_scores_and_calibration():
    n, k, h, c = 200, 32, 3, 2
    samples = RNG.normal(size=(n, k, h, c)).astype(np.float32)
    y = RNG.normal(size=(n, h, c)).astype(np.float32)
    out, pit = F.evaluate(samples, y, key=jax.random.key(5, impl="rbg"), return_pit=True)
    x64, y64 = samples.astype(np.float64), y.astype(np.float64)
    crps = np.abs(x64 - y64[:, None]).mean(1) - np.abs(x64[:, :, None] - x64[:, None]).sum((1, 2)) / (2 * k * k)
    np.testing.assert_allclose(out["crps"], crps.mean(), rtol=1e-5)
    np.testing.assert_allclose(out["mse"], np.mean((x64.mean(1) - y64) ** 2), rtol=1e-5)
    np.testing.assert_allclose(out["mae"], np.mean(np.abs(x64.mean(1) - y64)), rtol=1e-5)
    lo, hi = np.quantile(x64, [0.05, 0.95], axis=1)
    np.testing.assert_allclose(out["coverage_0.9"], np.mean((y64 >= lo) & (y64 <= hi)), atol=1e-6)
    np.testing.assert_allclose(out["width_0.9"], np.mean(hi - lo), rtol=1e-5)
    # QICE as in the reference evaluation code (np.percentile edges, two outside bins dropped)
    q = np.percentile(x64, np.arange(11) * 10.0, axis=1)  # [11, n, h, c]
    member = (y64[None] - q > 0).sum(0).ravel()
    counts = np.bincount(member, minlength=12)[1:-1]
    np.testing.assert_allclose(out["qice"], np.abs(0.1 - counts / member.size).mean(), atol=1e-6)
    assert pit.shape == (n, h, c) and 0 < pit.min() and pit.max() < 1
    # calibrated forecasts: coverage near nominal (1200 targets; 4 s.e. + ensemble-quantile slack)
    assert abs(out["coverage_0.9"] - 0.9) < 4 * math.sqrt(0.09 / 1200) + 2 / k
    assert abs(out["coverage_0.5"] - 0.5) < 4 * math.sqrt(0.25 / 1200) + 2 / k
    with pytest.raises(ValueError, match=r"samples must be \[b, K, H, c\] and y \[b, H, c\]"):
        F.evaluate(samples[:, :, :2], y)
    with pytest.raises(ValueError, match=r"alphas must lie in \(0, 1\)"):
        F.evaluate(samples, y, alphas=(1.2,))


def test_train_ppm_learns_a_noisy_sine_and_samples_batched():
    # y continues a sine with N(0, 0.5^2) noise: training lowers the validation loss and the sample
    # spread ends near sqrt(0.5^2 - h^2) = 0.4 (the KDE-NLL optimum leaves the kernel's h^2 to the KDE)
    L, H, n = 16, 4, 512
    t0 = RNG.uniform(0, 2 * np.pi, size=(n, 1, 1))
    x = np.sin(t0 + 0.3 * np.arange(L)[None, :, None]).astype(np.float32)
    clean = np.sin(t0 + 0.3 * np.arange(L, L + H)[None, :, None])
    y = (clean + 0.5 * RNG.normal(size=clean.shape)).astype(np.float32)
    cfg = M.PPMConfig(seq_len=L, pred_len=H, d_model=16, d_ff=32)
    model = M.PPM(cfg, rngs=nnx.Rngs(0))
    loss = F.make_ppm_loss(F.HybridLossConfig(num_samples=16, tau=1.0))
    r = F.train(model, loss, (x[:448], y[:448]), (x[448:], y[448:]), key=KEY,
                config=F.TrainConfig(learning_rate=3e-3, lr_decay=0.9, batch_size=64, epochs=12, patience=0))
    vals = [e["val_loss"] for e in r.history]
    assert len(vals) == 12 and r.steps == 12 * 7 and r.num_params == cfg.num_params()
    assert min(vals) < vals[0] - 0.1 and r.best_epoch == 1 + int(np.argmin(vals))
    s = F.sample_ppm(r.model, x[448:], jax.random.key(9, impl="rbg"), num_samples=32, batch_size=40)
    assert s.shape == (64, 32, H, 1)
    mse_mean = float(np.mean((s.mean(1) - clean[448:]) ** 2))
    assert mse_mean < 0.1  # the mean tracks the clean continuation (noise variance 0.25)
    assert 0.2 < float(s.std(1).mean()) < 0.6


def test_configs_and_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="kernel must be one of"):
        F.HybridLossConfig(kernel="box")
    with pytest.raises(ValueError, match="bandwidth must be > 0, got 0.0"):
        F.HybridLossConfig(bandwidth=0.0)
    with pytest.raises(ValueError, match="num_samples must be an int >= 1, got 0"):
        F.HybridLossConfig(num_samples=0)
    with pytest.raises(ValueError, match=r"lr_decay must be in \(0, 1\], got 1.5"):
        F.TrainConfig(lr_decay=1.5)
    with pytest.raises(ValueError, match="series of length 5 is shorter than seq_len \\+ pred_len = 6"):
        F.sliding_windows(np.zeros((5, 1)), seq_len=4, pred_len=2)
    with pytest.raises(ValueError, match=r"period must be in \[1, L=6\], got 7"):
        F.seasonal_naive(np.zeros((1, 6, 1)), period=7, pred_len=2)
    with pytest.raises(ValueError, match=r"residuals must be \[m, H, c\]"):
        F.bootstrap_samples(KEY, np.zeros((2, 3, 1)), np.zeros((4, 2, 1)), num_samples=2)
    with pytest.raises(ValueError, match="train_data must be"):
        F.train(M.PointMLP(M.PPMConfig(seq_len=4, pred_len=2, d_model=2, d_ff=2), rngs=nnx.Rngs(0)), F.mse_loss,
                (np.zeros((3, 4, 1)), np.zeros((2, 2, 1))), (np.zeros((3, 4, 1)), np.zeros((3, 2, 1))), key=KEY)


# ---------------------------------------------------------------- the conditional DDPM baseline


def _zero_output(model):
    model.out.w[...] = jnp.zeros_like(model.out.w[...])
    model.out.b[...] = jnp.zeros_like(model.out.b[...])
    return model


def test_ddpm_loss_of_a_zero_predictor_is_the_noise_variance():
    cfg = M.PPMConfig(seq_len=12, pred_len=6, d_model=8, d_ff=16)
    model = _zero_output(M.DiffusionMLP(cfg, rngs=nnx.Rngs(0)))
    x = jax.random.normal(jax.random.key(0), (64, 12, 3))
    y = jax.random.normal(jax.random.key(1), (64, 6, 3))
    loss, parts = F.make_ddpm_loss(ddpm.ddpm_schedule(num_steps=10))(model, x, y, jax.random.key(2))
    n = 64 * 3 * 6  # E[noise^2] = 1, Var[noise^2] = 2
    assert abs(float(loss) - 1.0) < 5 * math.sqrt(2 / n) and float(parts["eps_mse"]) == float(loss)


def test_ddpm_sampler_follows_the_reverse_chain_and_the_window_scale():
    # A zero noise predictor makes every step y_{t-1} = y_t / sqrt(alpha_t) + sigma_t z: a float64 recursion
    # gives the output variance on the normalized scale; the samples come back on the window's scale.
    cfg = M.PPMConfig(seq_len=16, pred_len=4, d_model=8, d_ff=16)
    model = _zero_output(M.DiffusionMLP(cfg, rngs=nnx.Rngs(0)))
    sch = ddpm.ddpm_schedule(num_steps=8)
    x = np.asarray(jax.random.normal(jax.random.key(3), (3, 16, 2)))
    s = F.sample_ddpm(model, x, jax.random.key(4), sch, num_samples=4000, batch_size=2)
    assert s.shape == (3, 4000, 4, 2)
    b = np.asarray(sch.betas, np.float64)
    abar = np.cumprod(1 - b)
    post = np.concatenate([[0.0], b[1:] * (1 - abar[:-1]) / (1 - abar[1:])])
    v = 1.0
    for i in range(len(b) - 1, -1, -1):
        v = v / (1 - b[i]) + post[i]
    m, sd = x.mean(1), x.std(1)  # [3, 2]
    z = (s - m[:, None, None]) / sd[:, None, None]
    n = z[..., 0].size // 3
    assert np.all(np.abs(z.mean(axis=(1, 2))) < 5 * math.sqrt(v / n))
    np.testing.assert_allclose(z.std(axis=(1, 2)), math.sqrt(v), rtol=5 / math.sqrt(2 * n))
    shifted = F.sample_ddpm(model, x + 5.0, jax.random.key(4), sch, num_samples=4000, batch_size=2)
    np.testing.assert_allclose(shifted, s + 5.0, atol=1e-4)
    with pytest.raises(ValueError, match="num_samples"):
        F.sample_ddpm(model, x, jax.random.key(4), sch, num_samples=0)
