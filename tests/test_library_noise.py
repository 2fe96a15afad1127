"""Library noise after a failure goes to ``WORKDIR/debug.log``: stderr keeps the command's own line and one line
saying where the rest went, never a traceback.

A subprocess (a tiny Python that loads ``attn_jax/cli/_noise.py`` by path, without JAX) makes the four kinds of
report seen after a full disk: a library thread's exception (tensorboardX's writer), an exception in an atexit
callback (its flush at exit), one in a finaliser (asyncio's closed loop) and an un-awaited coroutine (orbax's).
"""

import os
import subprocess
import sys
import textwrap

NOISE_MODULE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "attn_jax", "cli", "_noise.py")
SCRIPT = textwrap.dedent(
    """
    import atexit, gc, importlib.util, sys, threading
    spec = importlib.util.spec_from_file_location("noise", sys.argv[1])
    noise = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noise)
    if sys.argv[3] == "quiet":
        noise.route_library_noise(sys.argv[2], "train")

    def flush():
        raise OSError(28, "No space left on device")

    atexit.register(flush)  # like tensorboardX's cleanup, registered after the router
    worker = threading.Thread(target=flush, name="writer")
    worker.start()
    worker.join()

    class Task:
        def __del__(self):
            raise RuntimeError("Event loop is closed")

    Task()
    async def write_fragment():
        pass

    write_fragment()
    gc.collect()
    print("attn-jax train: error: cannot write checkpoint step 6: No space left on device", file=sys.stderr)
    sys.exit(1)
    """
)


def _run(tmp_path, mode):
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, NOISE_MODULE, str(tmp_path), mode], capture_output=True, text=True
    )


def test_library_noise_goes_to_the_debug_log(tmp_path):
    loud = _run(tmp_path, "verbose")  # -v: Python's own reports, as without the router
    assert loud.stderr.count("Traceback") == 3 and "never awaited" in loud.stderr
    assert not (tmp_path / "debug.log").exists()
    quiet = _run(tmp_path, "quiet")
    assert quiet.returncode == 1
    lines = quiet.stderr.strip().splitlines()
    assert "Traceback" not in quiet.stderr
    assert lines == [
        "attn-jax train: error: cannot write checkpoint step 6: No space left on device",
        f"attn-jax train: 4 library report(s) (tracebacks of the same failure) are in {tmp_path / 'debug.log'} "
        "(-v shows them here)",
    ]
    log = (tmp_path / "debug.log").read_text()
    assert log.count("Traceback") == 3
    for text in ("Exception in thread writer", "Event loop is closed", "No space left", "never awaited"):
        assert text in log, text


def test_a_full_disk_for_the_log_is_counted(tmp_path):
    """The log itself cannot be written (here: its directory is missing): the reports are counted, not shown."""
    quiet = _run(tmp_path / "missing", "quiet")
    assert "Traceback" not in quiet.stderr
    assert quiet.stderr.strip().splitlines()[-1] == (
        "attn-jax train: 4 library report(s) (tracebacks of the same failure) could not be written to "
        f"{tmp_path / 'missing' / 'debug.log'} (a full disk?) (-v shows them here)"
    )
