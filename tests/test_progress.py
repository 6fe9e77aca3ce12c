"""Progress lines on a fake clock: the ETA arithmetic, how often lines come, the one limit warning."""
from lib.core.progress import Progress, RunTimes, duration


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def progress(total=1000, **kwargs):
    clock, lines = Clock(), []
    return Progress("pretrain", total, "tokens", clock, out=lines.append, **kwargs), clock, lines


def test_durations_keep_two_units():
    assert [duration(s) for s in (0, 44.6, 60, 190, 3599, 3600, 7500, 90061)] == [
        "0s", "45s", "1m00s", "3m10s", "59m59s", "1h00m", "2h05m", "25h01m"]


def test_the_eta_is_the_work_left_at_the_mean_rate_so_far():
    p, clock, _ = progress()
    assert p.status() == "0/1,000 tokens (0.0%) elapsed 0s eta ?"
    clock.now += 62
    p.update(250)  # 250 tokens in 62 s: 750 more take 186 s
    assert p.status() == "250/1,000 tokens (25.0%) elapsed 1m02s eta 3m06s"


def test_a_resumed_run_counts_its_earlier_part_in_elapsed_but_not_in_its_rate():
    p, clock, _ = progress()
    p.start(done=500, elapsed_s=600)  # half done in 10 minutes by a killed run
    clock.now += 10
    p.update(600)  # 100 tokens in 10 s here: 400 more take 40 s
    assert p.status() == "600/1,000 tokens (60.0%) elapsed 10m10s eta 40s"


def test_an_unknown_total_gives_a_count_without_share_or_eta():
    p, clock, _ = progress(total=None)
    clock.now += 5
    p.update(12_000)
    assert p.status() == "12,000 tokens elapsed 5s"


def test_lines_come_at_most_every_every_s_and_a_loop_that_printed_closes_at_its_total():
    p, clock, lines = progress(every_s=30)
    for done in range(1, 1001):
        clock.now += 0.125  # 8 tokens/s, 125 s in all
        p.tick(done, "  loss 1.0")
    assert lines == ["pretrain: 240/1,000 tokens (24.0%) elapsed 30s eta 1m35s  loss 1.0",
                     "pretrain: 480/1,000 tokens (48.0%) elapsed 1m00s eta 1m05s  loss 1.0",
                     "pretrain: 720/1,000 tokens (72.0%) elapsed 1m30s eta 35s  loss 1.0",
                     "pretrain: 960/1,000 tokens (96.0%) elapsed 2m00s eta 5s  loss 1.0",
                     "pretrain: 1,000/1,000 tokens (100.0%) elapsed 2m05s eta 0s  loss 1.0"]


def test_a_loop_shorter_than_every_s_prints_nothing():
    p, clock, lines = progress(total=10, every_s=30)
    for done in range(1, 11):
        clock.now += 1
        p.tick(done)
    assert lines == []


def test_a_run_the_limit_will_stop_says_so_once_with_how_far_it_will_get():
    p, clock, lines = progress(limit_s=60, limit_key="pretrain.budget_minutes")
    clock.now += 10
    p.update(200)  # 20 tokens/s: done at 50 s, within the limit
    assert lines == []
    clock.now += 10
    p.update(250)  # 12.5 tokens/s: 20 s + 60 s > 60 s; by 60 s it reaches 250 + 40 * 12.5 = 750
    clock.now += 10
    p.update(300)  # still too slow: no second warning
    assert lines == ["warning: pretrain: at this speed the 1-minute time limit (pretrain.budget_minutes) "
                     "will end the run at ~75% of its 1,000 tokens"]


def test_no_limit_no_warning():
    p, clock, lines = progress()
    clock.now += 1000
    p.update(1)
    assert lines == []


def test_runs_of_unequal_kinds_are_estimated_from_their_own_kind_only():
    times = RunTimes()
    times.add(("imdb", "ulmfit"), 100)
    times.add(("imdb", "ulmfit"), 120)
    times.add(("imdb", "frozen"), 4)
    assert times.left([("imdb", "ulmfit"), ("imdb", "frozen")]) == (114, 0)
    assert times.eta_s([("imdb", "ulmfit"), ("imdb", "frozen")]) == 114
    assert times.left([("imdb", "frozen"), ("sst2", "ulmfit")]) == (4, 1)
    assert times.eta_s([("imdb", "frozen"), ("sst2", "ulmfit")]) is None
    clock, lines = Clock(), []
    p = Progress("finetune", 16, "runs", clock, out=lines.append, estimate=lambda: times.eta_s([("imdb", "frozen")]))
    clock.now += 300
    p.update(3)
    assert p.status() == "3/16 runs (18.8%) elapsed 5m00s eta 4s"
