"""The ppm experiment's cause text (class "spec") carries the run's calibration numbers."""

from experiments import ppm as E


def _row(cov, qice):
    return {"coverage_0.9": cov, "qice": qice}


def test_cause_reports_coverage_and_qice_per_variant():
    per = {"gaussian": {"PPM": _row(0.481, 0.0489), E.KDE_ROW: _row(0.787, 0.0148)},
           "bimodal": {"PPM": _row(0.669, 0.0368), E.KDE_ROW: _row(0.771, 0.0227)}}
    text = E._cause(per, E.EXPERIMENT.presets["quick"]())
    assert "spec 10(d)" in text and "K=8" in text and "h=0.3" in text
    assert "gaussian 0.48 (with kernel noise 0.79, QICE 4.89% -> 1.48%)" in text
    assert "bimodal 0.67 (with kernel noise 0.77, QICE 3.68% -> 2.27%)" in text
