"""A watchdog must not take its own stall for its peers' silence."""
from runtime.liveness import PeerLiveness


def test_a_peer_silent_past_the_timeout_is_reported_with_its_silence():
    live = PeerLiveness(timeout_s=2.0, check_period_s=0.25)
    live.heard("w1", 0.0)
    live.heard("w2", 0.0)
    for t in (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75):
        live.heard("w2", t)
        assert live.check(t) == {}
    live.heard("w2", 2.0)
    assert live.check(2.0) == {"w1": 2.0}


def test_a_stalled_watchdog_discounts_its_stall():
    live = PeerLiveness(timeout_s=2.0, check_period_s=0.25)
    live.heard("w1", 0.0)
    assert live.check(0.25) == {}
    # the event loop was blocked for 3 s: the heartbeats sent meanwhile still wait in the socket
    assert live.check(3.25) == {}
    assert live.silent_for_s("w1", 3.25) == 0.5 + 0.25  # heard 0.25 s before the stall began, plus the allowance
    # the peer really is gone: it is reported once the timeout has passed in time the watchdog could listen
    t = 3.25
    while not live.check(t):
        t += 0.25
        assert t < 6.0
    assert 4.5 <= t <= 5.0


def test_know_does_not_reset_a_peer_already_heard():
    live = PeerLiveness(timeout_s=1.0, check_period_s=0.25)
    live.heard("w1", 0.0)
    live.know("w1", 0.9)
    live.know("w2", 0.9)
    assert live.last_heard_s("w1") == 0.0 and live.last_heard_s("w2") == 0.9
    live.forget("w1")
    assert live.last_heard_s("w1") is None


def test_time_without_a_connection_is_not_the_peers_silence():
    """A dispatcher whose NATS node died hears nobody while it reconnects: nobody is declared dead for that."""
    live = PeerLiveness(timeout_s=2.0, check_period_s=0.25)
    live.heard("w1", 0.0)
    assert live.check(0.25) == {}
    t = 0.25
    while t < 5.0:  # 4.75 s disconnected, watchdog ticking on time
        t += 0.25
        assert live.check(t, is_listening=False) == {}
    assert live.silent_for_s("w1", t) == 0.25  # its clock stood still
    # connected again: the peer has the rest of its timeout to be heard
    reported_at = None
    while reported_at is None:
        t += 0.25
        reported_at = t if live.check(t) else None
    assert reported_at == 5.0 + 1.75
