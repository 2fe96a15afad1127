"""``attn-jax serve``: request checks, dynamic batching and the bounded queue as plain Python; the HTTP server
over a real socket (refusals in one line and counted, 503 when full, SIGTERM answers the requests in flight);
and a trained run served equals ``attn-jax translate``."""

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from attn_jax.cli import main  # noqa: E402
from attn_jax.serve import (  # noqa: E402
    Batcher,
    BatchResult,
    Limits,
    QueueFull,
    RequestError,
    RunTranslator,
    bind,
    build_app,
    parse_request,
)

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Echo:
    """A stand-in model: upper-cases each sentence, after ``delay`` seconds per call; records its batches."""

    description = "echo"

    def __init__(self, delay: float = 0.0):
        self.delay = delay
        self.batches: list[tuple[list[str], object]] = []

    def key(self, options):
        if dict(options).get("beam") == 0:
            raise RequestError(422, "bad_option", "beam must be >= 1, got 0")
        return options

    def check(self, sentences):
        pass

    def __call__(self, sentences, key):
        self.batches.append((list(sentences), key))
        time.sleep(self.delay)
        return BatchResult([s.upper() for s in sentences], [s == "cut" for s in sentences])


@contextlib.contextmanager
def serving(app):
    """``app`` under uvicorn in a thread on a free 127.0.0.1 port; yields its URL; stops it at the end."""
    import uvicorn

    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


# --- the request checks -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        (b"not json", 400, "not_json"),
        (b"\xff\xfe", 400, "not_json"),
        (b"[1, 2]", 400, "bad_request"),
        (b'{"sentences": "one string"}', 400, "bad_request"),
        (b'{"sentences": ["a", 3]}', 400, "bad_request"),
        (b'{"sentences": ["two\\nlines"]}', 400, "bad_request"),
        (json.dumps({"sentences": ["a"] * 4}).encode(), 413, "too_many_sentences"),
        (json.dumps({"sentences": ["w " * 6]}).encode(), 413, "sentence_too_long"),
        (b'{"sentences": ["a"], "beam": "4"}', 422, "bad_option"),
        (b'{"sentences": ["a"], "beam": true}', 422, "bad_option"),
        (b'{"sentences": ["a"], "alpha": NaN}', 422, "bad_option"),
        (b'{"sentences": ["a"], "sample": true}', 422, "bad_option"),
        (b'{"sentences": ["a"], "pad": "' + b"x" * 300 + b'"}', 413, "body_too_large"),
    ],
)
def test_bad_bodies_are_refused_in_one_line(body, status, reason):
    with pytest.raises(RequestError) as e:
        parse_request(body, Limits(max_sentences=3, max_tokens=5, max_body_bytes=200))
    assert (e.value.status, e.value.reason) == (status, reason)
    assert "\n" not in str(e.value) and str(e.value)


def test_good_body_strips_sentences_and_types_options():
    got = parse_request(b'{"sentences": [" a b ", ""], "alpha": 1, "beam": 3, "beta": null}', Limits())
    assert got.sentences == ("a b", "")
    assert got.options == (("alpha", 1.0), ("beam", 3))  # an int is a float; null is the default


# --- the batcher --------------------------------------------------------------------------------------------


def test_concurrent_requests_share_batches_of_one_key_up_to_the_most():
    echo = Echo()

    async def go():
        batcher = Batcher(echo, max_batch=4, max_wait_s=0.05, max_queue=64)
        await batcher.start()
        keys = ["k1"] * 7 + ["k2"] * 3
        jobs = [batcher.submit([f"s{i}"], k) for i, k in enumerate(keys)]
        jobs.append(batcher.submit(["x", "y", "cut", "z", "w"], "k1"))  # more than max_batch: alone
        out = await asyncio.gather(*jobs)
        await batcher.stop()
        return out, batcher.metrics.snapshot()

    out, metrics = asyncio.run(go())
    assert out[:10] == [[(f"S{i}", False)] for i in range(10)]
    assert out[10] == [("X", False), ("Y", False), ("CUT", True), ("Z", False), ("W", False)]
    sizes = [len(b) for b, _ in echo.batches]
    assert sorted(sizes) == [3, 3, 4, 5] and sum(sizes) == 15
    assert all(len({k for _ in b}) == 1 for b, k in echo.batches)
    assert {tuple(b): k for b, k in echo.batches}[("s7", "s8", "s9")] == "k2"
    assert metrics["batch_sizes"] == {"3": 2, "4": 1, "5": 1} and metrics["sentences"] == 15
    assert metrics["stopped_at_limit"] == 1


def test_a_full_queue_refuses_and_stop_answers_what_waits():
    echo = Echo(delay=0.3)

    async def go():
        batcher = Batcher(echo, max_batch=1, max_wait_s=0.0, max_queue=2)
        await batcher.start()
        first = asyncio.create_task(batcher.submit(["a"]))
        await asyncio.sleep(0.1)  # "a" is in the model; two more may wait
        waiting = [asyncio.create_task(batcher.submit([s])) for s in "bc"]
        await asyncio.sleep(0.01)
        with pytest.raises(QueueFull, match="queue is full"):
            await batcher.submit(["d"])
        await batcher.stop()
        return await asyncio.gather(first, *waiting)

    assert asyncio.run(go()) == [[("A", False)], [("B", False)], [("C", False)]]


# --- the HTTP server ----------------------------------------------------------------------------------------


def test_every_bad_request_is_a_4xx_json_line_and_counted():
    app = build_app(Echo(), limits=Limits(max_sentences=2, max_tokens=3), max_queue=4)
    bad = [
        (b"{", 400),
        (json.dumps({"sentences": ["a", "b", "c"]}).encode(), 413),
        (json.dumps({"sentences": ["a b c d"]}).encode(), 413),
        (json.dumps({"sentences": ["a"], "beam": 0}).encode(), 422),
        (json.dumps({"sentences": ["a"], "nbest": 2}).encode(), 422),
    ]
    with serving(app) as url, httpx.Client(base_url=url, timeout=10) as client:
        good = client.post("/translate", json={"sentences": ["a b", "", "cut"], "beam": 2})
        assert good.status_code == 413  # three sentences: over this server's two
        good = client.post("/translate", json={"sentences": ["a b", "cut"], "beam": 2})
        assert good.status_code == 200
        assert good.json() == {"translations": ["A B", "CUT"], "stopped_at_limit": [1]}
        for body, status in bad:
            r = client.post("/translate", content=body, headers={"content-type": "application/json"})
            assert r.status_code == status, r.text
            assert "\n" not in r.text and set(r.json()) == {"error", "reason"}
        assert client.get("/nowhere").status_code == 404
        assert client.get("/translate").status_code == 405
        assert client.get("/health").json() == {"status": "ok", "model": "echo"}
        m = client.get("/metrics").json()
    assert m["requests"] == 9 and m["refused"] == 8 and m["requests_by_status"]["200"] == 1
    assert m["refused_by_reason"] == {
        "bad_option": 2,
        "method_not_allowed": 1,
        "not_found": 1,
        "not_json": 1,
        "sentence_too_long": 1,
        "too_many_sentences": 2,
    }
    assert m["sentences"] == 2 and m["stopped_at_limit"] == 1 and m["latency_s"]["window"] == 9


def test_a_full_queue_answers_503_and_counts_it():
    echo = Echo(delay=0.4)
    app = build_app(echo, limits=Limits(max_sentences=1), max_batch=1, max_wait_s=0.0, max_queue=1)

    async def go(url):
        async with httpx.AsyncClient(base_url=url, timeout=20) as client:
            send = lambda i: client.post("/translate", json={"sentences": [f"s{i}"]})  # noqa: E731
            first = asyncio.create_task(send(0))
            await asyncio.sleep(0.2)  # s0 in the model; one sentence may wait
            rest = await asyncio.gather(*[send(i) for i in range(1, 5)])
            return [await first, *rest], (await client.get("/metrics")).json()

    with serving(app) as url:
        answers, m = asyncio.run(go(url))
    codes = sorted(r.status_code for r in answers)
    assert codes == [200, 200, 503, 503, 503]
    assert all(r.json()["reason"] == "queue_full" for r in answers if r.status_code == 503)
    assert m["refused_by_reason"] == {"queue_full": 3} and m["requests"] == 5


_SLOW_SERVER = """
import sys, time
from attn_jax.serve import BatchResult, bind, build_app, run
class Slow:
    description = "slow"
    def key(self, options): return options
    def check(self, sentences): pass
    def __call__(self, sentences, key):
        time.sleep(1.0)
        return BatchResult([s.upper() for s in sentences], [False] * len(sentences))
sock = bind("127.0.0.1", 0)
app = build_app(Slow(), max_batch=2, max_wait_s=0.0)
run(app, sock, on_ready=lambda: print(sock.getsockname()[1], flush=True))
print("stopped", flush=True)
"""


def test_sigterm_answers_the_requests_in_flight():
    env = {**os.environ, "PYTHONPATH": _ROOT, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_SERVER],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        port = int(proc.stdout.readline())
        url = f"http://127.0.0.1:{port}"

        async def go():
            async with httpx.AsyncClient(base_url=url, timeout=20) as client:
                jobs = [
                    asyncio.create_task(client.post("/translate", json={"sentences": [f"s{i}"]}))
                    for i in range(3)
                ]
                await asyncio.sleep(0.4)  # all three arrived; the first batch of two is in the model
                proc.send_signal(signal.SIGTERM)
                return await asyncio.gather(*jobs)

        answers = asyncio.run(go())
        assert [r.status_code for r in answers] == [200, 200, 200]
        assert [r.json()["translations"] for r in answers] == [["S0"], ["S1"], ["S2"]]
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 0 and out.strip() == "stopped", err
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_flags_are_checked_before_loading(capsys):
    assert main(["serve", "--workdir", "/nonexistent", "--max-queue", "4", "--max-sentences", "8"]) == 2
    assert "--max-queue 4 must be >= --max-sentences 8" in capsys.readouterr().err
    assert main(["serve", "--workdir", "/nonexistent", "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("attn-jax serve: error:") and err.count("\n") == 1


# --- a trained run ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run_and_translate(tmp_path_factory):
    """A tiny untrained RNNsearch run, and ``attn-jax translate --beam 3``'s output on SENTENCES."""
    from tests.test_export import SENTENCES, _make_run

    tmp = tmp_path_factory.mktemp("serve")
    run = _make_run(tmp / "run", "rnnsearch")
    src, out = tmp / "in.txt", tmp / "out.txt"
    src.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    assert (
        main(["translate", "--workdir", run, "--input", str(src), "--output", str(out), "--beam", "3"]) == 0
    )
    return run, SENTENCES, out.read_text(encoding="utf-8").splitlines()


def test_served_run_translates_as_translate(run_and_translate):
    run, sentences, expected = run_and_translate
    app = build_app(RunTranslator([run]), max_wait_s=0.05)

    async def go(url):
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            whole = await client.post("/translate", json={"sentences": sentences, "beam": 3})
            one_each = await asyncio.gather(
                *[client.post("/translate", json={"sentences": [s], "beam": 3}) for s in sentences]
            )
            bad = await client.post("/translate", json={"sentences": ["a"], "beam": 0})
            return whole, one_each, bad, (await client.get("/metrics")).json()

    with serving(app) as url:
        whole, one_each, bad, m = asyncio.run(go(url))
    assert whole.status_code == 200 and whole.json()["translations"] == expected
    assert [r.json()["translations"][0] for r in one_each] == expected
    # Untrained, the five non-blank sentences run to their length limit, as translate warns.
    assert whole.json()["stopped_at_limit"] == [0, 1, 3, 4, 5]
    assert bad.status_code == 422 and bad.json()["error"] == "beam must be >= 1, got 0"
    assert m["batches"] >= 2 and m["sentences"] == 2 * len(sentences)


def test_served_export_translates_as_translate_and_refuses_other_options(run_and_translate, tmp_path):
    from attn_jax.serve import ExportTranslator

    run, sentences, expected = run_and_translate
    assert main(["export", "--workdir", run, "--output", str(tmp_path / "x"), "--beam", "3"]) == 0
    app = build_app(ExportTranslator(str(tmp_path / "x")))
    with serving(app) as url, httpx.Client(base_url=url, timeout=120) as client:
        got = client.post("/translate", json={"sentences": sentences, "beam": 3, "alpha": 0.6})
        other = client.post("/translate", json={"sentences": ["a"], "beam": 4})
        fixed = client.post("/translate", json={"sentences": ["a"], "max_length": 4})
        long = client.post("/translate", json={"sentences": ["a " * 16]})
    assert got.status_code == 200 and got.json()["translations"] == expected
    assert got.json()["stopped_at_limit"] == [0, 1, 3, 4, 5]
    assert other.status_code == 422 and "'beam' is 3 in the export, got 4" in other.json()["error"]
    assert fixed.status_code == 422 and "fixed in the export" in fixed.json()["error"]
    assert long.status_code == 413 and long.json()["reason"] == "sentence_too_long"


def test_a_body_over_the_limit_is_refused_declared_or_chunked():
    app = build_app(Echo(), limits=Limits(max_sentences=2, max_body_bytes=100), max_queue=4)
    body = json.dumps({"sentences": ["a" * 200]}).encode()

    def chunks():
        yield body[:50]
        yield body[50:]

    with serving(app) as url, httpx.Client(base_url=url, timeout=10) as client:
        declared = client.post("/translate", content=body)
        chunked = client.post("/translate", content=chunks())
        m = client.get("/metrics").json()
    assert declared.status_code == chunked.status_code == 413
    assert declared.json()["reason"] == chunked.json()["reason"] == "body_too_large"
    assert m["refused_by_reason"] == {"body_too_large": 2}


def test_the_command_serves_a_run_and_stops_on_sigterm(run_and_translate):
    """``attn-jax serve --port 0`` names its address on stderr, answers as translate, exits 0 on SIGTERM."""
    run, sentences, expected = run_and_translate
    env = {**os.environ, "PYTHONPATH": _ROOT, "JAX_PLATFORMS": "cpu"}
    argv = [sys.executable, "-m", "attn_jax.cli", "serve", "--workdir", run, "--port", "0"]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env)
    try:
        ready = proc.stderr.readline()
        assert ready.startswith("attn-jax serve: ") and " on http://127.0.0.1:" in ready, ready
        url = ready.split(" on ")[-1].strip()
        r = httpx.post(url + "/translate", json={"sentences": sentences[:2], "beam": 3}, timeout=120)
        assert r.status_code == 200 and r.json()["translations"] == expected[:2]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert proc.stderr.read().strip() == "attn-jax serve: stopped"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_failed_model_call_is_a_counted_500_and_the_server_goes_on():
    class Flaky(Echo):
        def __call__(self, sentences, key):
            if "boom" in sentences:
                raise RuntimeError("the model\nfailed")
            return super().__call__(sentences, key)

    with serving(build_app(Flaky(), max_wait_s=0.0)) as url, httpx.Client(base_url=url, timeout=10) as client:
        bad = client.post("/translate", json={"sentences": ["boom"]})
        good = client.post("/translate", json={"sentences": ["ok"]})
        m = client.get("/metrics").json()
    assert bad.status_code == 500 and bad.json()["error"] == "translation failed: the model failed"
    assert "\n" not in bad.text and good.json()["translations"] == ["OK"]
    assert m["refused_by_reason"] == {"model_error": 1} and m["requests_by_status"] == {"200": 1, "500": 1}
