"""Progress reporting: log lines at intervals with unit and rate, a final line, a bar on request."""
from __future__ import annotations

import logging

import pytest

from funnelrag.progress import Progress, progress


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_log_lines_at_intervals_with_unit_rate_and_time_left(caplog):
    clock = FakeClock()
    caplog.set_level(logging.INFO, logger="funnelrag.progress")
    with Progress("embed passages", total=1000, unit="passages", show_bar=False,
                  interval_s=30, clock=clock) as bar:
        for _ in range(10):
            clock.t += 10
            bar.update(100, loss=0.5)
    lines = [r.getMessage() for r in caplog.records]
    # 100 s in steps of 10 s: a line at 30, 60 and 90 s, then the closing line.
    assert len(lines) == 4
    assert lines[0] == "embed passages: 300/1,000 passages (10.0 passages/s, 30 s, ~70 s left) loss=0.5"
    assert lines[-1] == "embed passages: 1,000/1,000 passages (10.0 passages/s, 100 s) loss=0.5 (done)"


def test_unknown_total_and_idempotent_close(caplog):
    clock = FakeClock()
    caplog.set_level(logging.INFO, logger="funnelrag.progress")
    bar = Progress("ingest", unit="pages", show_bar=False, clock=clock)
    clock.t += 4
    bar.update(8)
    bar.close()
    bar.close()
    assert [r.getMessage() for r in caplog.records] == ["ingest: 8 pages (2.0 pages/s, 4 s) (done)"]


def test_slow_rates_keep_their_digits(caplog):
    clock = FakeClock()
    caplog.set_level(logging.INFO, logger="funnelrag.progress")
    with Progress("train reader", total=100, unit="steps", show_bar=False, clock=clock) as bar:
        clock.t += 50
        bar.update(2)
    assert caplog.records[0].getMessage().startswith("train reader: 2/100 steps (25.0 s each, 50 s, ~41 min left)")


def test_iterator_wrapper_counts_every_item_and_takes_len(caplog):
    caplog.set_level(logging.INFO, logger="funnelrag.progress")
    out = list(progress(["a", "b", "c"], "questions", unit="questions", show_bar=False))
    assert out == ["a", "b", "c"]
    assert caplog.records[-1].getMessage().startswith("questions: 3/3 questions")


def test_bar_mode_uses_tqdm(capsys):
    with Progress("steps", total=5, unit="steps", show_bar=True) as bar:
        bar.update(5, loss=1.25)
    err = capsys.readouterr().err
    assert "steps" in err and "5/5" in err and "loss=1.25" in err


@pytest.mark.parametrize("kwargs", [{"interval_s": 0}, {"total": -1}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        Progress("x", **kwargs)


def test_heartbeat_logs_while_a_wait_lasts(caplog):
    import time  # noqa: PLC0415

    from funnelrag.progress import heartbeat  # noqa: PLC0415

    caplog.set_level(logging.INFO, logger="funnelrag.progress")
    with heartbeat("starting the API", interval_s=0.05):
        time.sleep(0.3)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "starting the API ..." and lines[-1].startswith("starting the API: done in ")
    assert any(line.startswith("starting the API: still waiting (") for line in lines[1:-1])
