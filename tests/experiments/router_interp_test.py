"""router_interp's config sections (issue 25): bad values name their dotted path, and the LM's checkpoint
fingerprint stays the repr of the flat config it had before the sections (so older checkpoints resume)."""

import dataclasses

import pytest

from experiments import registry
from experiments import router_interp as exp


@pytest.mark.parametrize("kwargs, field", [
    (dict(worlds=("ssh", "bogus")), "worlds"),
    (dict(worlds=("ssh",)), "worlds"),
    (dict(interp=exp.InterpSection(min_precision=0.0)), "interp.min_precision"),
])
def test_bad_values_name_their_dotted_path(kwargs, field):
    with pytest.raises(registry.ConfigError) as e:
        exp.Config(**kwargs)
    assert e.value.field == field


def test_lm_fingerprint_is_the_flat_repr_and_follows_every_section():
    c = exp.EXPERIMENT.config("quick")
    fp = exp._lm_fingerprint(c)
    assert fp.startswith("Config(worlds=(), train_sequences=1000, test_sequences=300, seq_len=32, d_model=128, ")
    assert ", sae_latents=512, sae_k=8, sae_steps=2000, sae_batch_size=1024, sae_learning_rate=0.001, " in fp
    assert ", lm=True, lm_domains=6, lm_vocab=48, lm_seq_len=48, lm_model=MoELMConfig(" in fp
    assert fp.endswith(", lm_sae_latents=256, lm_sae_k=8, lm_sae_steps=1500, seed=0, progress=True)")
    assert exp._lm_fingerprint(dataclasses.replace(c, progress=False, worlds=("ssh", "single_domain"))) == fp
    for section, field, value in (("planted", "d_model", 64), ("sae", "k", 4), ("interp", "tie_margin", 0.05),
                                  ("lm", "steps", 10)):
        changed = dataclasses.replace(c, **{section: dataclasses.replace(getattr(c, section), **{field: value})})
        assert exp._lm_fingerprint(changed) != fp, (section, field)
