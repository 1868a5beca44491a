"""``Stack.up`` when the UI's port is taken between its choice and Docker's bind (tests run beside each other).

No Docker here: ``compose`` is replaced by what Docker's userland proxy does at `up`, binding the port the
`.env` names on 127.0.0.1, and Docker's words when that fails. The real `up` runs in ``test_stack.py``.
"""

from __future__ import annotations

import socket
import stat
import subprocess

import pytest

from tests.compose.conftest import UI_PORT_ATTEMPTS, Stack, free_port, write_dotenv

IN_USE = ("ERROR: for airflow-apiserver  Cannot start service airflow-apiserver: driver failed programming external "
          "connectivity on endpoint traffic-test-1_airflow-apiserver_1 (5f0c): Error starting userland proxy: "
          "listen tcp4 127.0.0.1:{port}: bind: address already in use")
ALLOCATED = "Bind for 127.0.0.1:{port} failed: port is already allocated"


def _dotenv(stack: Stack) -> dict[str, str]:
    return dict(line.split("=", 1) for line in stack.dotenv.read_text().splitlines())


@pytest.fixture
def stack(tmp_path):
    """A Stack whose ``up`` publishes the UI as Docker would: a listening socket on the `.env`'s port, or
    Docker's error when something holds it. ``stack.calls`` lists the ports each ``up`` tried."""
    dotenv = tmp_path / ".env"
    stack = Stack(env={}, project="traffic-test-ports", dotenv=dotenv, values=write_dotenv(dotenv, free_port()))
    stack.calls, stack.published = [], []

    def compose(*args, timeout=900, check=True):
        port = int(_dotenv(stack)["AIRFLOW_UI_PORT"])  # what Docker reads: the file, not our dict
        stack.calls.append(port)
        proxy = socket.socket()
        try:
            proxy.bind(("127.0.0.1", port))
            proxy.listen()
        except OSError:
            proxy.close()
            return subprocess.CompletedProcess(args, 1, "", stack.error.format(port=port))
        stack.published.append(proxy)
        return subprocess.CompletedProcess(args, 0, "", "")

    stack.compose, stack.error = compose, IN_USE
    yield stack
    for proxy in stack.published:
        proxy.close()


@pytest.mark.parametrize("error", [IN_USE, ALLOCATED], ids=["held by a process", "held by a container"])
def test_a_taken_port_moves_the_ui_to_another_and_up_runs_again(stack, error):
    before = dict(stack.values)
    taken = int(before["AIRFLOW_UI_PORT"])
    stack.error = error
    assert stack.api.url.endswith(f":{taken}")  # a client made before the move
    with socket.socket() as holder:  # another worker took the port after it was chosen
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        stack.up("--scale", "spark-connect=0")
    assert stack.calls[0] == taken and len(stack.calls) == 2, stack.calls
    moved = stack.calls[1]
    assert moved != taken and stack.published[0].getsockname() == ("127.0.0.1", moved)
    # Only the port changed: the secrets Postgres and Airflow were started with stay; the file stays private.
    assert _dotenv(stack) == stack.values == {**before, "AIRFLOW_UI_PORT": str(moved)}
    assert stat.S_IMODE(stack.dotenv.stat().st_mode) == 0o600
    assert stack.api.url.endswith(f":{moved}")  # ... is not the one used after it


def test_a_port_taken_every_time_fails_saying_so(stack):
    held = []
    stack.compose_real = stack.compose

    def always_taken(*args, **kwargs):  # whatever port is chosen, something holds it by the time of the bind
        port = int(_dotenv(stack)["AIRFLOW_UI_PORT"])
        holder = socket.socket()
        holder.bind(("127.0.0.1", port))
        holder.listen()
        held.append(holder)
        return stack.compose_real(*args, **kwargs)

    stack.compose = always_taken
    try:
        with pytest.raises(AssertionError, match=rf"the UI could not be published: each of the ports \[.*\] was taken"):
            stack.up()
    finally:
        for holder in held:
            holder.close()
    assert len(stack.calls) == UI_PORT_ATTEMPTS and len(set(stack.calls)) == UI_PORT_ATTEMPTS, stack.calls


def test_any_other_failure_of_up_fails_at_once(stack):
    stack.compose = lambda *args, **kwargs: (stack.calls.append(args), subprocess.CompletedProcess(
        args, 1, "", "ERROR: for spark-master  manifest for traffic-python:3.11-bookworm not found"))[1]
    with pytest.raises(AssertionError, match="manifest for traffic-python"):
        stack.up()
    assert len(stack.calls) == 1
