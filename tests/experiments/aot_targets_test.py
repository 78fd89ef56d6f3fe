"""Every experiment's `train_step` (the target of ``python -m experiments aot <slug>``) is the step its `run`
trains: the same model, optimizer, global batch and token length of ``inputs``, at every preset.

The expected values are rebuilt here from the config and the task, independently of `train_step` (the
optimizer through the helper `run` itself calls, which the source check below pins), and with libtpu
installed the smallest smoke step is compiled for a v5e 2x2 slice.
"""

import importlib
import inspect
import pathlib

import numpy as np
import pytest

from algorithms import training
from experiments import aot, registry
from models.transformer import TransformerConfig


def _lm_arithmetic(m, c):
    task = m._task(c)
    return c.model.transformer(task.tokenizer().vocab_size), c.train.batch_size, task.max_seq_len - 1


def _style_heads(m, c):
    corpus = m._corpus(c)
    return c.model.transformer(corpus.tokenizer().vocab_size), c.train.batch_size, corpus.max_seq_len - 1


def _hyper_icl(m, c):
    # BOS + (max_demos + 1) "list > y ;" groups, the last without its ";", minus the shift
    return (c.model.transformer(c.vocab_size), c.pretrain.batch_size,
            (c.task.max_demos + 1) * (c.task.num_groups + 3) - 1)


def _camp(m, c):
    return c.model.transformer(c.question_world().tokenizer().vocab_size), c.sft.batch, m.SEQ_LEN - 1


def _rosa2(m, c):
    users = c.simulated_users()
    inputs = users.train_batch(c.train.batch, np.random.default_rng(0), ambiguous_fraction=c.train.ambiguous_fraction,
                               intent_weights=c.train.intent_weights)["inputs"]
    assert inputs.shape[0] == c.train.batch
    return c.model.transformer(users.vocab_size), c.train.batch, inputs.shape[1]


def _router_interp(m, c):
    return c.lm.model.transformer(c.lm.vocab), c.lm.batch_size, c.lm.seq_len


def _safethink(m, c):
    task = c.task  # [BOS] prompt trace [EOS] padded to prompt_len + max_trace_len + 1, minus the shift
    return c.model.transformer(task.tokenizer().vocab_size), c.train.batch_size, task.prompt_len + task.max_trace_len


def _moe_rerouting(m, c):
    task = m.DomainTask(seed=c.seed)
    inputs = task.train_batch(0, 2, c.train.seq_len)["inputs"]
    return c.model.transformer(task.tokenizer.vocab_size), c.train.batch_size, inputs.shape[1]


def _rl_compute_allocation(m, c):
    task = m._lm_task(c)
    return c.lm.model.transformer(task.tokenizer().vocab_size), c.lm.sft_batch, task.max_seq_len - 1


def _scm_grpo(m, c):
    task = m._task(c)
    seq_len = task.max_prompt_len + 1 + task.max_target_len(c.sft.max_pad) + 1
    return c.model.transformer(task.tokenizer().vocab_size), c.sft.batch, seq_len - 1


def _differential_smoothing(m, c):
    task = m._task(c)
    return c.model.transformer(task.tokenizer().vocab_size), c.sft.batch, task.max_seq_len - 1


# slug -> (expected (model, batch_size, seq_len), the optimizer helper, the function of `run`'s that trains with
# it, whether a config trains no LM with `fit` (train_step refuses it))
HOOKED = {
    "lm_arithmetic": (_lm_arithmetic, "_optimizer", "run", lambda c: False),
    "style_heads": (_style_heads, "_optimizer", "_train", lambda c: False),
    "hyper_icl": (_hyper_icl, "_pretrain_optimizer", "pretrain", lambda c: False),
    "camp": (_camp, "_sft_optimizer", "_sft", lambda c: False),
    "rosa2": (_rosa2, "_optimizer", "_train", lambda c: False),
    "router_interp": (_router_interp, "_lm_optimizer", "_run_lm", lambda c: not c.lm.enabled),
    "safethink": (_safethink, "_optimizer", "run", lambda c: False),
    "moe_rerouting": (_moe_rerouting, "_optimizer", "_train_lm", lambda c: False),
    "rl_compute_allocation": (_rl_compute_allocation, "_sft_optimizer", "run_lm", lambda c: not c.lm.enabled),
    "scm_grpo": (_scm_grpo, "_sft_optimizer", "_sft", lambda c: c.sft.steps == 0),
    "differential_smoothing": (_differential_smoothing, "_sft_optimizer", "run_countdown",
                               lambda c: not c.lm or c.sft.steps == 0),
}


# The hooks of the experiments that are not decoder LMs trained with `fit`'s default loss are pinned by their own
# test files, in the same way: slug -> the file.
PINNED_ELSEWHERE = {
    "qvg": "aot_targets_vision_test.py", "toast": "aot_targets_vision_test.py", "prim": "aot_targets_vision_test.py",
    "dem_hec": "aot_targets_vision_test.py",
    "nmars": "aot_targets_loop_test.py", "staged_vlm": "aot_targets_loop_test.py",
    "sparse_scaling": "aot_targets_loop_test.py", "vegas": "aot_targets_loop_test.py", "ffd": "aot_targets_loop_test.py",
    "plmd": "aot_targets_other_test.py", "fm_active_learning": "aot_targets_other_test.py",
    "eelma": "aot_targets_other_test.py", "mvprobe": "aot_targets_other_test.py",
    "e2i_vrwkv": "aot_targets_e2i_test.py",
    "ppm": "aot_targets_weights_test.py", "weightclip": "aot_targets_weights_test.py",
    "spf": "aot_targets_spf_test.py",
}


def test_the_hooked_experiments_are_exactly_these():
    hooked = {s for s in registry.implemented_slugs() if registry.get(s).train_step is not None}
    assert hooked == set(HOOKED) | set(PINNED_ELSEWHERE)
    assert set(aot.targets()) == {"lm_1b", *hooked}
    here = pathlib.Path(__file__).parent
    for slug, name in PINNED_ELSEWHERE.items():
        assert f'"{slug}"' in (here / name).read_text(), (slug, name)


@pytest.mark.parametrize("slug", sorted(HOOKED))
def test_every_preset_builds_the_step_run_trains(slug):
    expected, optimizer_helper, trainer, off = HOOKED[slug]
    exp = registry.get(slug)
    module = importlib.import_module(f"experiments.{slug}")
    # run's training passes exactly this helper's optimizer to `fit` (no second copy of the schedule to drift)
    assert f"optimizer_config={optimizer_helper}(c)" in inspect.getsource(getattr(module, trainer)) or \
        f"opt = {optimizer_helper}(c)" in inspect.getsource(getattr(module, trainer))
    built = 0
    for preset in exp.presets:
        c = exp.config(preset)
        if off(c):
            with pytest.raises(ValueError, match=f"^{slug} "):
                exp.train_step(c)
            continue
        step = exp.train_step(c)
        model, batch_size, seq_len = expected(module, c)
        assert isinstance(step, aot.TrainStep) and isinstance(step.model, TransformerConfig), preset
        assert step.model == model, preset
        assert isinstance(step.optimizer, training.OptimizerConfig) and step.optimizer == getattr(module, optimizer_helper)(c)
        assert step.optimizer.learning_rate > 0 and step.optimizer.total_steps > 0, preset
        assert (step.batch_size, step.seq_len) == (batch_size, seq_len), preset
        assert step.batch_size > 0 and step.seq_len > 0 and step.model.num_params() > 0, preset
        assert step.loss_fn is training.next_token_loss, preset  # every hooked run trains with fit's default loss
        built += 1
    assert built >= 1 and exp.train_step(exp.config("paper")).batch_size > 0  # the paper preset always has one


def test_the_smallest_smoke_step_compiles_for_v5e(compile_smoke_step):
    slug, step, row = compile_smoke_step([s for s in HOOKED])
    assert row["seq_len"] == step.seq_len and isinstance(step.model, TransformerConfig), slug
