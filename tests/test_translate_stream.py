"""``attn-jax translate`` streams standard input (issue 17 item 1): a line written to its stdin is answered
before stdin closes; a file is translated in batches with progress on stderr and one stdout line per input line.

The run is ``tests/test_cli_translate.make_run``'s (one untrained checkpoint at a tiny size, written in seconds).
"""

import os
import re
import select
import subprocess
import sys
import time

import pytest

from attn_jax.cli import main
from attn_jax.cli._translate import LineStream, split_lines
from attn_jax.pipeline import TranslateError
from tests.test_cli_translate import make_run

LINES = ["the dog slept .", "every monk stood , because the torch bit fragile lazy bananas ."]
ARGS = ["--beam", "2", "--max-length", "6"]  # short translations: the untrained model never chooses </s>
WAIT_S = 120.0  # the subprocess imports jax, loads the run and compiles the search before its first answer


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("run"))


def test_line_stream_takes_what_has_arrived_and_never_waits_for_more():
    read, write = os.pipe()
    try:
        source = LineStream(read)
        os.write(write, "\ufeffa b\r\n\nc\fd\npart".encode())
        batches = source.batches(2)
        assert next(batches) == ["a b", ""]  # BOM and CRLF dropped; a blank line is a line
        assert next(batches) == ["c\fd"]  # returns although the pipe is open: "part" has no \n yet
        os.write(write, b"ial\n\xff x\n")
        os.close(write)
        write = None
        assert next(batches) == ["partial"]  # the line before an unreadable one is still given
        # The offset counts the stream's bytes: 3 (BOM) + 5 + 1 + 4 + 8 lines before.
        with pytest.raises(TranslateError, match=r"stdin: invalid UTF-8 \(byte 0xff at offset 21\)"):
            next(batches)
    finally:
        os.close(read)
        if write is not None:
            os.close(write)
    # The lines of a closed pipe are split_lines' (the rule for a file), an unterminated last line included.
    text = "x\n\n y \u2028z\r\nlast"
    read, write = os.pipe()
    os.write(write, text.encode())
    os.close(write)
    got = [line for batch in LineStream(read).batches(32) for line in batch]
    os.close(read)
    assert got == split_lines(text)


def _read_line(proc: subprocess.Popen, buffer: bytearray) -> str:
    """The next line of ``proc``'s stdout within ``WAIT_S`` seconds (fails if none comes)."""
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + WAIT_S
    while b"\n" not in buffer:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(left, 0.0))
        if not ready:
            pytest.fail(f"no answer within {WAIT_S:.0f} s while stdin stays open (got {bytes(buffer)!r})")
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            err = proc.stderr.read().decode("utf-8", "replace") if proc.poll() is not None else ""
            pytest.fail(f"stdout closed before an answer (exit {proc.poll()}): {err}")
        buffer += chunk
    end = buffer.index(b"\n")
    line = bytes(buffer[:end]).decode("utf-8")
    del buffer[: end + 1]
    return line


def test_a_line_written_to_stdin_is_answered_before_stdin_closes(run_dir, tmp_path, capsys):
    cli = os.path.join(os.path.dirname(sys.executable), "attn-jax")
    proc = subprocess.Popen(
        [cli, "translate", "--workdir", run_dir, *ARGS],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        pending = bytearray()
        answers = []
        for sentence in LINES:
            proc.stdin.write(sentence.encode("utf-8") + b"\n")
            proc.stdin.flush()  # stdin stays open: the answer must not wait for its end
            answers.append(_read_line(proc, pending))
            assert proc.poll() is None  # still running, waiting for the next line
        rest, err = proc.communicate(timeout=WAIT_S)  # closes stdin: the end of input
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err.decode("utf-8", "replace")
    assert bytes(pending) + rest == b""  # one line per input line, nothing after the last
    # The length-limit summary covers both lines (totals at the end, as for a file).
    assert "2 of 2 translations stopped at the length limit (6 tokens)" in err.decode("utf-8")

    # An independent run reading the same lines from a file (batched together) gives the same translations.
    path = tmp_path / "in.txt"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    status = main(["translate", "--workdir", run_dir, "--input", str(path), *ARGS])
    out, _ = capsys.readouterr()
    assert status == 0
    assert answers == out.splitlines()
    assert all(len(a.split()) == 6 for a in answers)


def test_file_translation_shows_progress_on_stderr_only(run_dir, tmp_path, capsys):
    sources = [*LINES, "", "the dog slept .", "."]  # a blank line: a blank translation, not decoded
    path = tmp_path / "in.txt"
    path.write_text("\n".join(sources) + "\n", encoding="utf-8")
    argv = ["translate", "--workdir", run_dir, "--input", str(path), *ARGS, "--batch-size", "2"]
    status = main([*argv, "--progress", "lines"])
    out, err = capsys.readouterr()
    assert status == 0, err
    lines = out.splitlines()
    assert len(lines) == len(sources) and lines[2] == ""
    assert not any(line.startswith("decoding") for line in lines)  # progress never on stdout
    progress = [line for line in err.splitlines() if line.startswith("decoding ")]
    # ProgressLine's plain lines: the first batch, then at most one every 10 s, and the last (4 of 4).
    assert progress and progress[-1].startswith("decoding 4/4: ") and "sentences/s" in progress[-1]
    assert all(re.fullmatch(r"decoding [1-4]/4: .*ETA .*", line) for line in progress), progress
    # The default (auto) on a stderr that is not a terminal shows none; the translations are the same.
    status = main(argv)
    out_auto, err_auto = capsys.readouterr()
    assert status == 0 and out_auto == out
    assert "decoding" not in err_auto
