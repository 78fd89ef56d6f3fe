"""`fit` on a two-process CPU job equals one process: each process builds only its rows (issue 26).

Two subprocesses join one `jax.distributed` job over localhost (gloo collectives, 4 simulated CPU
devices each, an 8-device 2x2x2 mesh); each `batch_fn` draws only `training.process_rows` of the
global batch. Their loss history must equal a one-process run of the same global batches.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from algorithms import training as T

_COMMON = textwrap.dedent('''
    import numpy as np
    from algorithms import training as T
    from models import Transformer, TransformerConfig
    CFG = TransformerConfig(vocab_size=16, d_model=32, num_layers=1, num_heads=4, num_kv_heads=2, d_ff=64)
    OPT = T.OptimizerConfig(learning_rate=1e-2, warmup_steps=1, total_steps=3)
    GLOBAL = 8

    def row(position, i):  # row i of the global batch at a position, from (position, i) alone
        return np.random.default_rng([position, i]).integers(0, 16, 9).astype(np.int32)

    def batch_fn(position):
        rows = T.process_rows(GLOBAL)
        seqs = np.stack([row(position, i) for i in range(rows.start, rows.stop)])
        return {"inputs": seqs[:, :-1], "targets": seqs[:, 1:], "loss_mask": np.ones((len(seqs), 8), np.float32)}

    def losses():
        out = T.fit(model_fn=lambda rngs: Transformer(CFG, rngs=rngs), optimizer_config=OPT, batch_fn=batch_fn,
                    num_steps=3, log_every=1, progress=False, mesh_config=T.MeshConfig(data=2, fsdp=2, tensor=2))
        return [h["loss"] for h in out.history]
''')

_WORKER = textwrap.dedent('''
    import json, sys
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=sys.argv[1], num_processes=2, process_id=int(sys.argv[2]))
    assert jax.process_count() == 2 and jax.device_count() == 8
''') + _COMMON + 'print("LOSSES", json.dumps({"rows": [T.process_rows(GLOBAL).start], "losses": losses()}))\n'


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_equal_one_process():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    address = f"localhost:{_free_port()}"
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, address, str(i)], env=env, cwd=os.getcwd(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        assert p.returncode == 0, stderr[-3000:]
        outs.append(json.loads(stdout.split("LOSSES", 1)[1]))
    assert [o["rows"] for o in outs] == [[0], [4]]  # each process built its own half of the batch
    assert outs[0]["losses"] == outs[1]["losses"]  # one global computation
    namespace = {}
    exec(_COMMON, namespace)  # the same global batches on this one process (8 simulated devices)
    np.testing.assert_allclose(outs[0]["losses"], namespace["losses"](), rtol=1e-5)


def test_process_rows_partition_the_global_batch(monkeypatch):
    monkeypatch.setattr(T.jax, "process_count", lambda: 4)
    parts = []
    for i in range(4):
        monkeypatch.setattr(T.jax, "process_index", lambda i=i: i)
        parts.append(T.process_rows(12))
    assert [(s.start, s.stop) for s in parts] == [(0, 3), (3, 6), (6, 9), (9, 12)]
    with pytest.raises(ValueError, match="global_batch_size must be a positive multiple of the process count 4"):
        T.process_rows(10)
    with pytest.raises(TypeError, match="global_batch_size must be an int"):
        T.process_rows(8.0)


def test_fit_without_a_mesh_on_several_processes_is_refused(monkeypatch):
    monkeypatch.setattr(T.jax, "process_count", lambda: 2)
    with pytest.raises(ValueError, match="mesh_config must be given on a multi-process job"):
        T.fit(model_fn=None, optimizer_config=T.OptimizerConfig(), batch_fn=None, num_steps=1)
