"""SIGTERM waits for a write to the store to finish, then exits with 128 + 15."""

from __future__ import annotations

import os
import signal
import time

import pytest
import sqlalchemy as sa

from pipelines import interrupt


@pytest.fixture
def sigterm_handler():
    previous = signal.getsignal(signal.SIGTERM)
    interrupt.exit_on_sigterm()
    yield
    signal.signal(signal.SIGTERM, previous)


def _wait_for_exit(seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.01)


def test_sigterm_outside_a_write_exits_at_once(sigterm_handler):
    started = time.monotonic()
    with pytest.raises(SystemExit) as exc:
        os.kill(os.getpid(), signal.SIGTERM)
        _wait_for_exit()
    assert exc.value.code == 128 + signal.SIGTERM
    assert time.monotonic() - started < 1


def test_sigterm_inside_a_sqlite_transaction_lets_it_commit(sigterm_handler, tmp_path):
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'store.db'}")
    with engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE runs (status TEXT)"))

    def terminated_mid_statement(*args) -> None:
        # Called by SQLAlchemy inside the transaction, as a write to MLflow's store would be.
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.3)

    sa.event.listen(engine, "before_cursor_execute", terminated_mid_statement)
    with pytest.raises(SystemExit) as exc:
        with engine.begin() as connection:
            connection.execute(sa.text("INSERT INTO runs VALUES ('KILLED')"))
        _wait_for_exit()
    assert exc.value.code == 128 + signal.SIGTERM
    sa.event.remove(engine, "before_cursor_execute", terminated_mid_statement)
    with engine.connect() as connection:
        assert connection.execute(sa.text("SELECT status FROM runs")).scalars().all() == ["KILLED"]
    engine.dispose()


def test_sigterm_waits_for_an_uninterruptible_function(sigterm_handler):
    finished = []

    @interrupt.uninterruptible
    def end_run() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.3)
        finished.append(True)

    with pytest.raises(SystemExit):
        end_run()
        _wait_for_exit()
    assert finished == [True]


def test_a_store_that_stays_busy_does_not_defer_the_exit_forever(sigterm_handler, monkeypatch):
    monkeypatch.setattr(interrupt, "MAX_DEFER_SECONDS", 0.2)
    finished = []

    @interrupt.uninterruptible
    def hung_write() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        _wait_for_exit(5)
        finished.append(True)

    started = time.monotonic()
    with pytest.raises(SystemExit):
        hung_write()
    assert finished == [] and time.monotonic() - started < 2
