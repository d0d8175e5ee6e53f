"""The one training loop's cadence (bmrl.loop.Schedule): when metrics reach the host and when a checkpoint is
saved, for RL's schedule (every step logged, a checkpoint every N steps and after the last) and SFT's (a tenth
of the steps logged, a checkpoint by time); the loop itself runs in tests/test_train.py and tests/test_sft.py."""

from bmrl.loop import Schedule


def test_rl_schedule_logs_every_step_and_saves_every_n_and_after_the_last():
    rl = Schedule(9, every=4)
    assert all(rl.logs(done) for done in range(1, 10))
    assert [done for done in range(1, 10) if rl.saves(done, since_save_s=1e9)] == [4, 8, 9]  # time plays no part


def test_sft_schedule_logs_a_tenth_and_saves_at_the_first_log_step_after_its_minutes():
    sft = Schedule(80, minutes=5.0, log_every=8)
    logged = [done for done in range(1, 81) if sft.logs(done)]
    assert logged == [1, 9, 17, 25, 33, 41, 49, 57, 65, 73, 80]  # steps 0, 8, ... 72 (counted from 0), and the last
    assert [done for done in range(1, 81) if sft.saves(done, since_save_s=299.0)] == []
    assert [done for done in range(1, 81) if sft.saves(done, since_save_s=300.0)] == logged
