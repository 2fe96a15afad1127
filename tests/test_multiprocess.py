"""Multi-process training through ``attn-jax train``: 2 processes × 2 CPU devices train like 1 process × 4 devices,
their checkpoint resumes in a single process. A peer that never starts or dies: tests/test_multiprocess_failures.py.

Every process is a subprocess of its own (``jax.distributed`` is process-global) on 127.0.0.1 only, with a port
taken from a socket bound to port 0, and a hard ``timeout``. The two single-process runs share a persistent
compilation cache (the resumed run only loads programs); the 2-process runs use none (a cache shared by two
processes of one run, with ``JAX_SHARE_BINARY_BETWEEN_HOSTS``, left process 1 waiting for a program process 0
never sent, until Gloo's 30 s timeout stopped process 0).
"""

import os
import pathlib
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from attn_jax.cli import main
from attn_jax.parallel import cluster_environment, initialize
from attn_jax.train import load_checkpoint, read_metrics
from tests.conftest import TEST_XLA_FLAGS

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
ARGS = [
    "--config",
    f"{CONFIGS / 'rnnsearch_cpu.py'}:smoke",
    "--config.parallel.strategy=data",  # parallel.data=0: all 4 devices, however many processes hold them
    "--config.checkpoint_every=3",
    "--config.eval_every=3",
    "--config.log_every=1",
    "--config.tensorboard=false",
    "--progress=lines",
]
TIMEOUT = 600  # seconds per run: generous, a loaded 2-core machine compiles slowly; a hang fails, not blocks
# Same mesh, same batches, same program; only the all-reduce of the gradients crosses processes (Gloo over TCP)
# instead of staying in one, which may sum the 4 partial gradients in another order: ~1e-7 relative, which
# Adam (eps=1e-8) passes on to the parameters as ~1e-7 relative changes (measured: 2e-7 after 3 updates).
# atol=1e-5 is a few hundredths of one update (lr a few 1e-3), so a wrong batch split or a skipped update fails.
# Several Adam updates lie between the compared numbers, not one program's rounding: the policy's amplified case
# (tests/conftest.py), a measured tolerance of its own rather than tests.tolerance's formula (50× the measurement).
RTOL, ATOL = 1e-5, 1e-5


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(devices: int, cache: pathlib.Path | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env.update(
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {TEST_XLA_FLAGS}",
        JAX_PLATFORMS="cpu",
        PYTHONUNBUFFERED="1",
    )
    if cache is not None:
        env.update(
            JAX_COMPILATION_CACHE_DIR=str(cache),
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
            JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        )
    return env


def _start(workdir, logs: pathlib.Path, name: str, env: dict, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "attn_jax.cli", "train", *ARGS, "--workdir", str(workdir), *extra]
    out = open(logs / f"{name}.out", "w")  # noqa: SIM115 - closed with the process (_finish)
    err = open(logs / f"{name}.err", "w")  # noqa: SIM115
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err)
    proc.files = (out, err)
    proc.name, proc.logs = name, logs
    return proc


def _finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str, str]:
    """Wait for ``proc`` (killing it after ``timeout``); ``(returncode, stdout, stderr)``."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    finally:
        for f in proc.files:
            f.close()
    out = (proc.logs / f"{proc.name}.out").read_text()
    err = (proc.logs / f"{proc.name}.err").read_text()
    return proc.returncode, out, err


def _pair(workdir, logs, name, *extra, heartbeat=30, cache=None):
    port = _free_port()
    return [
        _start(
            workdir,
            logs,
            f"{name}{i}",
            _env(2, cache),
            "--coordinator",
            f"127.0.0.1:{port}",
            "--num-processes=2",
            f"--process-id={i}",
            f"--heartbeat-timeout={heartbeat}",
            "--distributed-timeout=120",
            *extra,
        )
        for i in range(2)
    ]


def _ok(result):
    code, out, err = result
    assert code == 0, out[-3000:] + err[-3000:]
    return out


def _close(got, want):
    got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got_leaves) == len(want_leaves) > 0
    for a, b in zip(got_leaves, want_leaves, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=ATOL)


@pytest.mark.slow
@pytest.mark.heavy  # 3 trainer processes, each compiling its steps: ~3 CPU-minutes; `make test-all` runs it
def test_two_processes_train_like_one_and_resume_in_one(tmp_path):
    cache, one, two = tmp_path / "jax_cache", tmp_path / "one", tmp_path / "two"
    # One process with 4 devices: updates 1-4, checkpoints at 3 and 4.
    bleu = "--config.validation.bleu=true"  # each process translates its share of the validation split
    _ok(_finish(_start(one, tmp_path, "one", _env(4, cache), "--config.num_train_steps=4", bleu), TIMEOUT))

    # Two processes with 2 devices each: the same mesh data=4 over both, updates 1-3.
    procs = _pair(two, tmp_path, "two", "--config.num_train_steps=3", bleu)
    results = [_finish(p, TIMEOUT) for p in procs]
    lead, other = _ok(results[0]), _ok(results[1])
    assert "joined: 2 local devices, 4 in all" in lead and "joined: 2 local devices, 4 in all" in other
    assert "mesh data=4 × model=1 × stage=1 over 4 devices in 2 process(es)" in lead
    assert "step 3/3" in lead and "step" not in other  # process 0 alone logs
    train = [r["step"] for r in read_metrics(two / "metrics.jsonl") if r["split"] == "train"]
    assert train == [1, 2, 3]  # written once, by process 0
    assert "each of 2 processes a share" in lead
    validation = {
        name: [r for r in read_metrics(w / "metrics.jsonl") if r["split"] == "validation" and r["step"] == 3]
        for name, w in (("one", one), ("two", two))
    }
    assert len(validation["two"]) == 1 and validation["two"][0]["translations"] > 0
    for key in ("translations", "stopped_at_limit"):
        assert validation["two"][0][key] == validation["one"][0][key]
    np.testing.assert_allclose(validation["two"][0]["bleu"], validation["one"][0]["bleu"], atol=1e-6)
    hypotheses = [(w / "validation" / "hypotheses-3.txt").read_text() for w in (one, two)]
    assert hypotheses[0] == hypotheses[1]  # parameters ~1e-7 apart: the same greedy translations

    got, want = load_checkpoint(two, step=3), load_checkpoint(one, step=3)
    _close(got.state["params"], want.state["params"])
    _close(got.state["opt_state"], want.state["opt_state"])
    assert got.data["next_index"] == want.data["next_index"] == 3
    assert got.data["schedule"] == want.data["schedule"]
    assert got.data["fingerprint"] != want.data["fingerprint"]  # process 0 of 2 is not process 0 of 1

    # The 2-process checkpoint resumes in one process (another process count, the same mesh shape).
    resumed = _ok(
        _finish(
            _start(two, tmp_path, "resumed", _env(4, cache), "--config.num_train_steps=4", "--resume"),
            TIMEOUT,
        )
    )
    assert "resumed from step 3" in resumed
    got, want = load_checkpoint(two, step=4), load_checkpoint(one, step=4)
    _close(got.state["params"], want.state["params"])
    _close(got.state["opt_state"], want.state["opt_state"])
    assert got.data["next_index"] == 4
    losses = {
        name: [
            r["loss"]
            for r in read_metrics(workdir / "metrics.jsonl")
            if r["split"] == "train" and r["step"] == 4
        ]
        for name, workdir in (("one", one), ("two", two))
    }
    np.testing.assert_allclose(losses["two"], losses["one"], rtol=1e-5)  # step 4 saw the same batch


LAUNCHER_VARIABLES = (
    "SLURM_JOB_ID",
    "SLURM_STEP_NODELIST",
    "SLURM_NTASKS",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "OMPI_MCA_orte_hnp_uri",
    "OMPI_COMM_WORLD_SIZE",
    "TPU_WORKER_HOSTNAMES",
)


@pytest.fixture
def no_launcher(monkeypatch):
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_cluster_environment_recognises_multi_process_launchers(no_launcher, monkeypatch):
    assert cluster_environment() is None
    slurm = dict(SLURM_JOB_ID="7", SLURM_STEP_NODELIST="n[1-2]", SLURM_PROCID="0", SLURM_LOCALID="0")
    for name, value in slurm.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SLURM_NTASKS", "1")
    assert cluster_environment() is None  # one task: a single process
    monkeypatch.setenv("SLURM_NTASKS", "2")
    assert cluster_environment() == "slurm"
    for name in slurm:
        monkeypatch.delenv(name)
    monkeypatch.setenv("OMPI_MCA_orte_hnp_uri", "1531576320.0;tcp://10.96.0.1:34911")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    assert cluster_environment() == "openmpi"
    monkeypatch.delenv("OMPI_MCA_orte_hnp_uri")
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "t1k-0")
    assert cluster_environment() is None
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "t1k-0,t1k-1")
    assert cluster_environment() == "tpu"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            dict(num_processes=2),
            r"needs coordinator \(--coordinator\) and process_id \(--process-id\) as well",
        ),
        (dict(coordinator="localhost", num_processes=2, process_id=0), "coordinator must be HOST:PORT"),
        (
            dict(coordinator="127.0.0.1:1234", num_processes=0, process_id=0),
            "num_processes must be a positive",
        ),
        (
            dict(coordinator="127.0.0.1:1234", num_processes=2, process_id=2),
            r"process_id must be .* \[0, .*=2\)",
        ),
        (
            dict(coordinator="127.0.0.1:1234", num_processes=2, process_id=0, heartbeat_timeout_s=0),
            "heartbeat_timeout_s must be a positive",
        ),
    ],
)
def test_initialize_rejects_incomplete_or_bad_arguments(no_launcher, kwargs, message):
    with pytest.raises(ValueError, match=message):
        initialize(**kwargs)


def test_initialize_without_arguments_or_launcher_is_a_single_process(no_launcher):
    assert initialize() is False and jax.process_count() == 1


def test_cli_multi_process_flag_errors_are_one_line(no_launcher, tmp_path, capsys):
    status = main(["train", "--config", ARGS[1], "--workdir", str(tmp_path), "--process-id", "1"])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("attn-jax train: error: a multi-process run needs coordinator (--coordinator)")


@pytest.mark.slow
@pytest.mark.heavy  # 3 trainer processes, each compiling its steps: minutes of CPU; `make test-all` runs it
def test_two_processes_read_their_share_of_prepared_data_like_one_in_memory(tmp_path):
    """The first process prepares the training split on disk (data.prepared_dir); both read their rows of it."""
    words = "a b c d e f g h i j".split()
    pairs = [
        (
            " ".join(words[(3 * k + i) % 10] for i in range(2 + k % 7)),
            " ".join(words[(k + i) % 10].upper() for i in range(1 + k % 6)),
        )
        for k in range(80)
    ]
    (tmp_path / "train.en").write_text("".join(s + "\n" for s, _ in pairs))
    (tmp_path / "train.fr").write_text("".join(t + "\n" for _, t in pairs))
    corpus = [
        "--config.data.corpus=plain",
        f"--config.data.source_path={tmp_path}/{{split}}.en",
        f"--config.data.target_path={tmp_path}/{{split}}.fr",
        "--config.data.eval_split=none",
        "--config.num_train_steps=3",
    ]
    one, two = tmp_path / "one", tmp_path / "two"
    _ok(_finish(_start(one, tmp_path, "one", _env(4), *corpus), TIMEOUT))
    results = [
        _finish(p, TIMEOUT) for p in _pair(two, tmp_path, "two", *corpus, "--config.data.prepared_dir=auto")
    ]
    lead, _ = _ok(results[0]), _ok(results[1])
    assert f"data: preparing the train split in {two}/prepared (none is there yet)" in lead
    assert sorted(os.listdir(two / "prepared")) == [
        "manifest.json",
        "train.src_offsets.npy",
        "train.src_tokens.npy",
        "train.tgt_offsets.npy",
        "train.tgt_tokens.npy",
        "vocab",
    ]
    got, want = load_checkpoint(two, step=3), load_checkpoint(one, step=3)
    _close(got.state["params"], want.state["params"])
    assert got.data["schedule"] == want.data["schedule"]  # the prepared fingerprint is the in-memory one
