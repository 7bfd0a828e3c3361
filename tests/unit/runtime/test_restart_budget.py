"""The launcher's restart budget: a crash loop is given up on, a child killed now and then is restarted forever."""
from runtime.restart_budget import RestartBudget, RestartPolicy

POLICY = RestartPolicy(max_num_restarts=5, refill_period_s=10.0, stable_after_s=10.0, first_backoff_s=0.25,
                       max_backoff_s=8.0)


def test_a_crash_loop_spends_the_budget_and_is_given_up_on():
    budget = RestartBudget(POLICY)
    decisions = [budget.on_exit(uptime_s=0.1) for _ in range(6)]
    assert [d.restart for d in decisions] == [True] * 5 + [False]
    assert "out of restart budget" in decisions[-1].reason
    # once given up, always given up: the supervisor does not try again by itself
    assert not budget.on_exit(uptime_s=1000.0).restart


def test_the_back_off_doubles_for_quick_exits_and_is_capped():
    budget = RestartBudget(RestartPolicy(max_num_restarts=10, first_backoff_s=0.25, max_backoff_s=2.0))
    assert [budget.on_exit(uptime_s=0.5).delay_s for _ in range(6)] == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]


def test_a_stable_run_resets_the_back_off():
    budget = RestartBudget(POLICY)
    for _ in range(3):
        budget.on_exit(uptime_s=0.5)
    assert budget.on_exit(uptime_s=60.0).delay_s == POLICY.first_backoff_s


def test_uptime_earns_restarts_back_up_to_the_bucket_size():
    budget = RestartBudget(POLICY)
    for _ in range(5):
        assert budget.on_exit(uptime_s=0.0).restart
    assert budget.tokens == 0.0
    # it then ran for 20 s: two restarts earned back, so it is restarted now with one left
    decision = budget.on_exit(uptime_s=20.0)
    assert decision.restart and decision.tokens_left == 1.0
    # a long stable run refills the bucket, never beyond its size
    assert budget.on_exit(uptime_s=10_000.0).tokens_left == POLICY.max_num_restarts - 1


def test_kills_in_a_row_of_a_child_that_runs_a_few_seconds_each_time_are_all_restarted():
    """What the fault test does to a dispatcher: kill it some 5 s after each start, once it serves again."""
    budget = RestartBudget(RestartPolicy())
    assert all(budget.on_exit(uptime_s=5.5).restart for _ in range(20))
    # a child that dies within 2 s of each start is a crash loop: given up on after a handful of restarts
    looping = RestartBudget(RestartPolicy())
    decisions = [looping.on_exit(uptime_s=2.0).restart for _ in range(20)]
    assert decisions.index(False) == 7 and not any(decisions[7:])  # 7 restarts, then given up


def test_the_give_up_reason_says_why_for_the_log():
    budget = RestartBudget(RestartPolicy(max_num_restarts=1, refill_period_s=30.0))
    assert budget.on_exit(uptime_s=1.0).restart
    reason = budget.on_exit(uptime_s=2.0).reason
    assert "1 restarts" in reason and "2.0 s" in reason and "30 s of uptime" in reason
