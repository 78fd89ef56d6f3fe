"""The spf experiment's cause classification."""

from experiments import spf as E
from experiments.checks import CAUSES, Check


def _metrics(spf_ls=1e-3, pdm_ls=1e-3, spf_lg=2e-3, pdm_lg=1e-3):
    def m(d, sigma=0.004):
        return {"optimality_distance": d, "final_mean_sigma": sigma}
    return {"least_squares": {"spf": m(spf_ls), "pdm": m(pdm_ls), "spf_no_malliavin": m(spf_ls * (1 + 1e-7))},
            "logistic": {"spf": m(spf_lg), "pdm": m(pdm_lg)}}


def test_cause_classes():
    c = E.Config()
    ok = [Check("logistic: SPF / PDM optimality distance", 1.0, "p", "<= 1.25", True)]
    assert E._cause(_metrics(), ok, c) == ("", None)
    # A failed SPF-vs-PDM check: the spec's reconstructed loss, with the run's sigma and ablation numbers.
    bad = [Check("logistic: SPF / PDM optimality distance", 2.0, "p", "<= 1.25", False)]
    text, cls = E._cause(_metrics(), bad, c)
    assert cls == "spec" and cls in CAUSES
    assert "2.00" in text and "0.004" in text and "lambda=0" in text
    # SPF behind PSG alone: too few episodes (scale).
    psg = [Check("logistic: SPF optimality distance vs PSG", 0.4, "p", "< PSG 0.26", False)]
    text, cls = E._cause(_metrics(), psg, c)
    assert cls == "scale" and "400 episodes" in text
    # A failed non-required check decides nothing.
    opt = [Check("logistic: SPF / PDM optimality distance", 2.0, "p", "<= 1.25", False, required=False)]
    assert E._cause(_metrics(), opt, c) == ("", None)
