"""`janus sim --watch APP`: one app's plans, instances and requests (sim/watch.py)."""
import json

import numpy as np
import pytest

from sim.cli import main
from sim.watch import blocked_story, bursts, resolve_app

from .shared_data import needs_traces

# six apps: every one of them is in the worst apps' table (eight rows), so the story is checked against its score
ARGS = ["--apps", "6", "--requests", "3000", "--duration-s", "60", "--window-s", "10", "--devices", "96",
        "--processes", "1", "--oracle", "clairvoyant"]


def test_an_app_is_named_in_full_or_by_a_prefix_only_it_has():
    names = ("app-5-c9", "app-5-c92", "app-53-c7")
    assert resolve_app(names, "app-5-c92") == 1
    assert resolve_app(names, "app-53") == 2
    assert resolve_app(names, "app-5-c9") == 0  # a full name wins over the prefix it is of another
    with pytest.raises(ValueError, match="2 apps .*: app-5-c9, app-5-c92"):
        resolve_app(names, "app-5-c")
    with pytest.raises(ValueError, match="no app"):
        resolve_app(names, "app-9")


def test_bursts_split_at_long_gaps_and_count_what_was_lost():
    arrival = np.array([0.0, 1.0, 2.0, 40.0, 41.0])
    output = np.array([10, 10, 10, 5, 5])
    first = np.array([0.5, 2.5, np.nan, 40.1, 41.1])  # a late first token; a failed request
    on_time = np.array([10, 4, 0, 5, 5])
    got = bursts(arrival, output, first, on_time, ttft_slo_s=1.0, gap_s=20.0)
    assert [(b["from_s"], b["to_s"], b["requests"]) for b in got] == [(0.0, 2.0, 3), (40.0, 41.0, 2)]
    assert [(b["tokens"], b["tokens_late"], b["ttft_missed"], b["failed"]) for b in got] == [(30, 16, 2, 1),
                                                                                           (10, 0, 0, 0)]
    assert bursts(arrival[:0], output[:0], first[:0], on_time[:0], 1.0) == []


def test_blocked_reports_are_the_apps_own_not_those_of_an_app_its_name_is_a_prefix_of():
    log = [(1.0, "1 instance(s) of app-5-c92: no free device"), (1.5, "2 instance(s) of app-5-c9: no free device"),
           (2.0, "app-5-c9@d3/prefill: failed recently on d3, cooling down"),
           (2.5, "app-5-c92@d4/decode: worker d4 is not alive")]
    assert [b["t_s"] for b in blocked_story(log, "app-5-c9")] == [1.5, 2.0]
    assert [b["t_s"] for b in blocked_story(log, "app-5-c92")] == [1.0, 2.5]


@needs_traces
@pytest.mark.slow  # ~10 s: two systems on 10 s of trace
def test_the_watch_tells_one_apps_story_as_the_run_scored_it(tmp_path, capsys):
    from sim.runner import ScenarioSpec

    trace = ScenarioSpec(num_apps=6, num_requests=3000, duration_s=60, window_s=10).build_trace()
    app = int(np.bincount(trace.app_ids).argmax())
    name = trace.app_names[app]
    code = main(ARGS + ["--systems", "static,janus", "--out", str(tmp_path), "--watch", name])
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    for system in ("static", "janus"):
        story = json.loads((tmp_path / f"watch-{name}-{system}.json").read_text())
        requests = story["requests"]
        assert len(requests["arrival_s"]) == int(np.sum(trace.app_ids == app))
        assert sum(b["requests"] for b in story["bursts"]) == len(requests["arrival_s"])
        late = sum(o - n for o, n in zip(requests["output_tokens"], requests["num_on_time_tokens"]))
        assert sum(b["tokens_late"] for b in story["bursts"]) == late
        scored = {w["name"]: w["token_attainment"] for w in next(
            s for s in summary["systems"] if s["system"] == system)["worst_apps"]}
        assert scored[name] == pytest.approx(1 - late / sum(requests["output_tokens"]))
        assert any(e["event"] == "launch" for e in story["lifecycle"]), "its instances came up"
        assert all(e["instance"] for e in story["lifecycle"])
    janus = json.loads((tmp_path / f"watch-{name}-janus.json").read_text())
    assert janus["plans"] and janus["plans"][0]["plan"].startswith("steady")  # the start-up plan placed it
    static = json.loads((tmp_path / f"watch-{name}-static.json").read_text())
    assert static["plans"] == [] and static["blocked"] == []  # static plans nothing, and has no reconciler
    assert all(b["detail"] for b in janus["blocked"])
    assert f"{name} on janus: its bursts" in capsys.readouterr().out


def test_an_unknown_app_is_refused_naming_the_option(capsys):
    with pytest.raises(SystemExit):
        main(ARGS + ["--watch", "no-such-app", "--out", "/nonexistent"])
    assert "--watch 'no-such-app'" in capsys.readouterr().err
