"""The roll call and the watch: plain TCP connections between the processes of a run, beside ``jax.distributed``.

Why: the JAX runtime meets every lost peer by terminating the process (``SIGABRT``, a C++ stack trace): a peer
that never starts (``RegisterTask DEADLINE_EXCEEDED`` after the join timeout), one killed mid-run (heartbeat
timeout, or the failed shutdown barrier once the survivor's own collective has failed), and its messages cannot
say which process is missing. So, before ``jax.distributed.initialize``, process 0 listens on the coordinator's
port and every other process connects there and says who it is (the *roll call*: a missing process is named
after the timeout). The connections stay open for the whole run (the *watch*): a process that is killed or
crashes closes its end at once (the kernel does), so the others learn which one is gone and can stop cleanly
before the runtime notices. A process that ends on purpose first says ``bye <exit status>``.

Wire format: one ASCII line per message. Peer → process 0: ``attn-jax-roll-call 1 <process id> <process
count>``; process 0 → peer: ``go`` once all have answered; either way ``bye <status>``; process 0 → peer ``lost
<process id> <status>`` (``-1``: closed without a goodbye) when another peer is gone.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections.abc import Callable

_HELLO = "attn-jax-roll-call 1"
# A peer's error line should win over "process k left with status s": on an error all processes hit together
# (a bad config) each one's own line comes within this long of the others' goodbyes.
_GOODBYE_GRACE_S = 2.0


class RollCallError(RuntimeError):
    """The roll call failed: a process missing after the timeout, unreachable, or inconsistent flags."""


def _split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _processes(ids) -> str:
    ids = sorted(ids)
    return f"process {ids[0]}" if len(ids) == 1 else "processes " + ", ".join(map(str, ids))


def _read_line(conn: socket.socket, deadline: float) -> str | None:
    """One line from ``conn`` before ``deadline`` (``time.monotonic``); None on timeout or a closed connection."""
    data = b""
    while not data.endswith(b"\n") and len(data) < 200:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        conn.settimeout(remaining)
        try:
            chunk = conn.recv(200 - len(data))
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return data.decode("ascii", "replace").strip()


def _listen(port: int) -> socket.socket:
    # On every interface, like the JAX coordination service that takes the port over afterwards.
    if socket.has_dualstack_ipv6():
        return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
    return socket.create_server(("", port))


def _call_the_roll(address: str, num_processes: int, timeout_s: float) -> dict[int, socket.socket]:
    """Process 0: wait up to ``timeout_s`` for every other process to say who it is; their connections by id."""
    deadline = time.monotonic() + timeout_s
    try:
        server = _listen(_split_address(address)[1])
    except OSError as e:
        raise RollCallError(
            f"process 0 cannot listen on {address} (the --coordinator address): {e.strerror or e}"
        ) from None
    peers: dict[int, socket.socket] = {}
    try:
        while len(peers) < num_processes - 1:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = set(range(1, num_processes)) - set(peers)
                raise RollCallError(
                    f"process 0 waited {timeout_s:g} s at {address} for {_processes(missing)} of "
                    f"{num_processes}, which never joined (is every process started, with the same "
                    "--coordinator and --num-processes?)"
                )
            server.settimeout(remaining)
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            words = (_read_line(conn, min(deadline, time.monotonic() + 5)) or "").split()
            if len(words) != 4 or " ".join(words[:2]) != _HELLO or not all(w.isdigit() for w in words[2:]):
                conn.close()  # not one of ours (a port scanner, a stale client): keep waiting
                continue
            process_id, count = int(words[2]), int(words[3])
            if count != num_processes or not 0 < process_id < num_processes or process_id in peers:
                conn.close()
                why = (
                    f"it was started with --num-processes {count}, this one with {num_processes}"
                    if count != num_processes
                    else "another process already joined with that id"
                    if process_id in peers
                    else f"ids run from 1 to {num_processes - 1} beside process 0"
                )
                raise RollCallError(f"a process joined {address} as process {process_id}: {why}")
            peers[process_id] = conn
        for conn in peers.values():
            conn.settimeout(None)
            conn.sendall(b"go\n")
    except BaseException:
        for conn in peers.values():
            conn.close()
        raise
    finally:
        server.close()
    return peers


def _answer_the_roll(address: str, num_processes: int, process_id: int, timeout_s: float) -> socket.socket:
    """A process other than 0: reach process 0 (retrying until ``timeout_s``), say who it is, wait for ``go``."""
    deadline = time.monotonic() + timeout_s
    host, port = _split_address(address)
    conn = None
    while conn is None:
        try:
            conn = socket.create_connection(
                (host, port), timeout=max(0.1, min(5.0, deadline - time.monotonic()))
            )
        except OSError:  # refused (process 0 not listening yet), unreachable, timed out
            if time.monotonic() >= deadline:
                raise RollCallError(
                    f"process {process_id} could not reach process 0 (the coordinator) at {address} within "
                    f"{timeout_s:g} s (is process 0 started, with this --coordinator?)"
                ) from None
            time.sleep(0.25)
    try:
        conn.sendall(f"{_HELLO} {process_id} {num_processes}\n".encode())
        answer = _read_line(conn, deadline)
    except OSError:
        answer = None
    if answer != "go":
        conn.close()
        waited = (
            "gave up or stopped" if time.monotonic() < deadline else f"did not answer within {timeout_s:g} s"
        )
        raise RollCallError(
            f"process {process_id} reached process 0 (the coordinator) at {address}, but not every one of the "
            f"{num_processes} processes joined: process 0 {waited} (its own error line names the missing ones)"
        )
    conn.settimeout(None)
    return conn


class Watch:
    """This process's connections to the others for the whole run; reports, once, the first one that is gone."""

    def __init__(
        self,
        address: str,
        num_processes: int,
        process_id: int,
        conns: dict[int, socket.socket],
        on_lost: Callable[[str], object],
    ):
        self.address, self.num_processes, self.process_id = address, num_processes, process_id
        self._conns = conns  # process 0: every peer by id; a peer: {0: its connection to process 0}
        self._on_lost = on_lost
        self._lock = threading.Lock()  # held while reporting a lost peer or while this process leaves
        self._leaving = False
        self._reported = threading.Event()
        self._said_bye: set[int] = set()
        threading.Thread(target=self._watch, name="attn-jax peer watch", daemon=True).start()

    def _who(self, process_id: int) -> str:
        if process_id == 0:
            return f"process 0 (the coordinator, {self.address})"
        return f"process {process_id} of {self.num_processes}"

    def _report(self, process_id: int, status: int, reported_by_0: bool = False) -> None:
        with self._lock:
            if self._leaving or self._reported.is_set():
                return
            self._reported.set()
            if self.process_id == 0:  # the other peers cannot see this one: tell them
                for other, conn in self._conns.items():
                    if other != process_id:
                        with contextlib.suppress(OSError):
                            conn.sendall(f"lost {process_id} {status}\n".encode())
            how = (
                "stopped without a goodbye (killed or crashed)"
                if status < 0
                else f"left with exit status {status} (its own error line says why)"
            )
            where = "" if process_id == 0 else f" in the run coordinated at {self.address}"
            told = " (as process 0 reports)" if reported_by_0 else ""
            self._on_lost(f"{self._who(process_id)} {how}{where}{told}; process {self.process_id} stops too")

    def _watch(self) -> None:
        selector = selectors.DefaultSelector()
        for process_id, conn in self._conns.items():
            selector.register(conn, selectors.EVENT_READ, [process_id, b""])
        while selector.get_map():
            for key, _ in selector.select():
                process_id, buffered = key.data
                try:
                    chunk = key.fileobj.recv(4096)
                except OSError:
                    chunk = b""
                if not chunk:  # closed: after a goodbye, a normal end; without one, killed or crashed
                    selector.unregister(key.fileobj)
                    if process_id not in self._said_bye:
                        self._report(process_id, -1)
                    continue
                *lines, key.data[1] = (buffered + chunk).split(b"\n")
                for line in lines:
                    self._message(process_id, line.decode("ascii", "replace").split())

    def _message(self, sender: int, words: list[str]) -> None:
        if len(words) == 2 and words[0] == "bye" and words[1].lstrip("-").isdigit():
            self._said_bye.add(sender)
            if int(words[1]) != 0:
                time.sleep(_GOODBYE_GRACE_S)
                self._report(sender, int(words[1]))
        elif len(words) == 3 and words[0] == "lost" and sender == 0 and words[1].isdigit():
            self._report(int(words[1]), int(words[2]) if words[2].lstrip("-").isdigit() else -1, True)

    def leave(self, status: int) -> None:
        """Tell the others this process ends with ``status``; a failing one (non-zero) stops reporting them."""
        with self._lock:
            if status != 0:
                self._leaving = True
            for conn in self._conns.values():
                with contextlib.suppress(OSError):
                    conn.sendall(f"bye {status}\n".encode())

    def await_report(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a lost peer to be reported; True if one was."""
        return self._reported.wait(timeout_s)


def roll_call(
    address: str, num_processes: int, process_id: int, timeout_s: float, on_lost: Callable[[str], object]
) -> Watch:
    """Gather every process of the run at ``address`` (process 0 listens there) and start watching them."""
    if process_id == 0:
        conns = _call_the_roll(address, num_processes, timeout_s)
    else:
        conns = {0: _answer_the_roll(address, num_processes, process_id, timeout_s)}
    return Watch(address, num_processes, process_id, conns, on_lost)
