"""The ppm experiment's cause text (class "scale") carries the run's accuracy, calibration and cost numbers; config
errors name the dotted field."""

import dataclasses

import pytest

from experiments import ppm as E
from experiments import registry


def _row(cov, qice, crps, params=100):
    return {"coverage_0.9": cov, "qice": qice, "crps": crps, "params": params}


def test_cause_reports_the_ddpm_comparison_calibration_and_sweep():
    per = {"gaussian": {"PPM": _row(0.636, 0.0358, 0.2777), E.KDE_ROW: _row(0.835, 0.0078, 0.2656),
                        E.DDPM: _row(0.833, 0.0096, 0.2678, params=8632)},
           "bimodal": {"PPM": _row(0.783, 0.0220, 0.3941), E.KDE_ROW: _row(0.847, 0.0108, 0.3906),
                       E.DDPM: _row(0.889, 0.0047, 0.3930, params=8632)}}
    sweep = {"gaussian": {}, "bimodal": {"K=8, h=0.3": _row(0.669, 0.0368, 0.4064)}}
    text = E._cause(per, E.EXPERIMENT.presets["quick"](), sweep, 29.5)
    assert "(8632 parameters, 30 epochs)" in text and "30x faster per window" in text
    assert "gaussian: CRPS PPM 0.2777 vs DDPM 0.2678, QICE 3.58% vs 0.96%" in text
    assert "gaussian 0.64 (with kernel noise 0.83)" in text and "K=32 training samples" in text
    assert "bimodal: K=8, h=0.3 -> 90% coverage 0.67, QICE 3.68%" in text


def test_config_errors_name_the_dotted_field():
    smoke = E.EXPERIMENT.config("smoke")
    with pytest.raises(registry.ConfigError, match=r"data.noises must be a non-empty subset of \('gaussian', "
                                                   r"'bimodal'\); got \('laplace',\)"):
        dataclasses.replace(smoke, data=dataclasses.replace(smoke.data, noises=("laplace",)))
    with pytest.raises(registry.ConfigError, match=r"models must be a subset of .* containing"):
        dataclasses.replace(smoke, models=("PPM",))
