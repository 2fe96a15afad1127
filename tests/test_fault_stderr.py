"""What a user sees on stderr when ``attn-jax translate`` or ``evaluate`` meets a damaged run: the command's own
warning or error line, and at most one line naming the debug log, never a traceback.

The commands run as real processes (``python -m attn_jax.cli``): library noise comes from TensorStore's threads
and from objects finalised at interpreter exit, which an in-process test cannot see. That noise is
timing-dependent; the damages here (a garbage ``array_metadatas`` file, a deleted OCDBT manifest) are the ones
that showed it most often.
"""

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from attn_jax.cli._noise import DEBUG_LOG, debug_log_path
from tests.test_checkpoint_damage import _damage, _two_step_run
from tests.test_cli_translate import make_run

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LENGTH_LIMIT = "stopped at the length limit"


@pytest.fixture(scope="module")
def intact_run(tmp_path_factory):
    return _two_step_run(make_run(tmp_path_factory.mktemp("source")), tmp_path_factory.mktemp("intact"))


def _copy(run, tmp_path) -> str:
    target = str(tmp_path / "run")
    shutil.copytree(run, target)
    return target


def _attn_jax(*argv) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "attn_jax.cli", *argv], capture_output=True, text=True, env=env, timeout=300
    )


def _own_lines(result, command: str) -> list[str]:
    """stderr's lines, each checked to be the command's own; the length-limit warning is left out."""
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    for line in lines:
        assert line.startswith(f"attn-jax {command}: "), result.stderr[-3000:]
    return [line for line in lines if LENGTH_LIMIT not in line]


def _log_line_names_the_log(lines: list[str], run: str) -> list[str]:
    """The lines other than the one that names the debug log (there when a library reported the failure)."""
    log = [line for line in lines if "library report" in line]
    assert len(log) <= 1
    for line in log:
        assert os.path.join(run, DEBUG_LOG) in line and line.endswith("(-v shows them here)")
    return [line for line in lines if line not in log]


def test_translate_past_a_damaged_step_is_one_warning(intact_run, tmp_path):
    run = _copy(intact_run, tmp_path)
    with open(os.path.join(run, "checkpoints", "4", "state", "array_metadatas", "process_0"), "w") as f:
        f.write("not json")
    source = tmp_path / "in.txt"
    source.write_text("the dog slept .\n", encoding="utf-8")
    result = _attn_jax("translate", "--workdir", run, "--input", str(source), "--beam", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(result.stdout.splitlines()) == 1
    (line,) = _log_line_names_the_log(_own_lines(result, "translate"), run)
    assert line.startswith("attn-jax translate: warning: cannot read checkpoint step 4 (")
    assert line.endswith("using step 2, the next best one that loads")
    assert "tensorstore_spec" not in line


def test_evaluate_with_no_readable_step_is_one_error(intact_run, tmp_path):
    run = _copy(intact_run, tmp_path)
    _damage(os.path.join(run, "checkpoints", "4"), "truncate")
    os.remove(os.path.join(run, "checkpoints", "2", "state", "manifest.ocdbt"))
    result = _attn_jax("evaluate", "--workdir", run, "--out", str(tmp_path / "eval"))
    assert result.returncode == 1 and result.stdout == ""
    (line,) = _log_line_names_the_log(_own_lines(result, "evaluate"), run)
    assert line.startswith(
        f"attn-jax evaluate: error: no checkpoint in {run}/checkpoints can be read: step 4 ("
    )
    assert "; step 2 (ValueError: NOT_FOUND: " in line and "tensorstore_spec" not in line


def test_translate_with_a_garbage_vocabulary_is_one_error(intact_run, tmp_path):
    run = _copy(intact_run, tmp_path)
    vocab = os.path.join(run, "vocab", "source", "vocab.json")
    with open(vocab, "wb") as f:
        f.write(bytes(range(256)) * 4)
    source = tmp_path / "in.txt"
    source.write_text("the dog slept .\n", encoding="utf-8")
    result = _attn_jax("translate", "--workdir", run, "--input", str(source))
    assert result.returncode == 1 and result.stdout == ""
    (line,) = _own_lines(result, "translate")
    assert line == (
        f"attn-jax translate: error: {run}: cannot read the vocabularies: {vocab}: not a saved vocabulary "
        "(UnicodeDecodeError: 'utf-8' codec can't decode byte 0x80 in position 128: invalid start byte)"
    )


def test_the_debug_log_is_in_the_run_when_it_can_be_written(tmp_path):
    assert debug_log_path(str(tmp_path), "translate") == str(tmp_path / DEBUG_LOG)
    assert not (tmp_path / DEBUG_LOG).exists()  # named, not created: a command without noise changes nothing
    elsewhere = debug_log_path(str(tmp_path / "missing"), "translate")
    (tmp_path / DEBUG_LOG).mkdir()
    assert debug_log_path(str(tmp_path), "evaluate") != str(tmp_path / DEBUG_LOG)
    for path in (elsewhere, debug_log_path(str(tmp_path), "evaluate")):
        assert os.path.dirname(path) == tempfile.gettempdir()
        assert os.path.basename(path).endswith(DEBUG_LOG)
