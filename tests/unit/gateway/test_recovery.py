from __future__ import annotations

from gateway.core.recovery import MAX_NUM_FAILED_PROBES, StreamRecovery, resend_due


def test_no_probe_before_a_worker_is_known():
    rec = StreamRecovery()
    assert not resend_due(rec, 100.0, gap_age_s=10.0)


def test_a_lasting_gap_or_a_long_silence_triggers_one_probe_at_a_time():
    rec = StreamRecovery(worker_id="w", last_event_s=0.0)
    assert not resend_due(rec, 0.2, gap_age_s=0.2)
    assert resend_due(rec, 0.5, gap_age_s=0.4)
    rec.start(0.5)
    assert not resend_due(rec, 5.0, gap_age_s=5.0)  # one in flight
    rec.succeed(1.0)
    assert not resend_due(rec, 1.2, gap_age_s=0.0)  # answered: alive, and too soon
    assert resend_due(rec, 4.5, gap_age_s=0.0)  # silent for 3.5 s since the answer


def test_the_stream_is_given_up_after_repeated_unanswered_probes():
    rec = StreamRecovery(worker_id="w", last_event_s=0.0)
    verdicts = []
    for i in range(MAX_NUM_FAILED_PROBES):
        rec.start(float(i * 2))
        verdicts.append(rec.fail(float(i * 2)))
    assert verdicts == [False] * (MAX_NUM_FAILED_PROBES - 1) + [True]
