"""Which error a failed first connection reports (runtime/bus.py, most_telling_error): nats-server answers a wrong
password with -ERR and closes the socket, and an attempt may read only the reset. A refused login seen by any attempt
is what the operator is told, or `janus status` says "no NATS" about a server that is up (a CI failure, stop 33)."""
from __future__ import annotations

from nats.errors import Error as NatsError

from runtime.bus import most_telling_error
from runtime.tools import NatsTarget, failure_line

TARGET = NatsTarget("nats://127.0.0.1:4222", "--nats", "operator", "wrong", "credentials.json")


def test_a_refused_login_outranks_a_later_reset():
    refusal = NatsError("nats: 'Authorization Violation'")
    reset = ConnectionResetError(104, "Connection reset by peer")
    assert most_telling_error([refusal, reset, reset]) is refusal
    assert "refused the login (credentials.json)" in failure_line(TARGET, most_telling_error([reset, refusal, reset]))


def test_without_a_refusal_the_last_error_is_reported():
    refused = ConnectionRefusedError(111, "Connect call failed")
    reset = ConnectionResetError(104, "Connection reset by peer")
    assert most_telling_error([refused, reset]) is reset
    assert failure_line(TARGET, reset).startswith("no NATS at nats://127.0.0.1:4222 (from --nats)")
