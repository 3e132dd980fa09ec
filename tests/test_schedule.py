"""The profiling schedule (pure): which steps are due, limits, resume, argument validation."""

from __future__ import annotations

import pytest

from tscope_callbacks.callbacks.schedule import NEVER, Schedule, normalize_stages


def test_default_schedule_profiles_start_step_then_multiples() -> None:
    assert Schedule().steps(1600) == [10, 500, 1000, 1500]
    assert Schedule(profile_first=False).steps(1600) == [500, 1000, 1500]


def test_small_schedule_and_no_duplicate_when_start_is_a_multiple() -> None:
    assert Schedule(every_n_steps=3, start_step=1).steps(8) == [1, 3, 6]
    assert Schedule(every_n_steps=3, start_step=3).steps(10) == [3, 6, 9]
    assert Schedule(every_n_steps=1, start_step=0).steps(4) == [0, 1, 2, 3]


def test_max_profiles_and_only_first() -> None:
    assert Schedule(every_n_steps=2, start_step=1, max_profiles=2).steps(100) == [1, 2]
    assert Schedule(every_n_steps=None, start_step=5).steps(100) == [5]
    assert Schedule(every_n_steps=5, max_profiles=0).steps(100) == []
    assert Schedule(every_n_steps=5, max_profiles=0).next_due(0) == NEVER


def test_start_step_beyond_run_profiles_nothing() -> None:
    assert Schedule(every_n_steps=3, start_step=50).steps(8) == []


def test_next_due_and_is_due_agree() -> None:
    s = Schedule(every_n_steps=4, start_step=2)
    due = [k for k in range(20) if s.is_due(k)]
    assert due == [2, 4, 8, 12, 16]
    assert s.next_due(0) == 2 and s.next_due(3) == 4 and s.next_due(5) == 8


def test_mark_prevents_reprofiling_and_state_round_trip() -> None:
    s = Schedule(every_n_steps=3, start_step=1, max_profiles=3)
    s.mark(1)
    s.mark(3)
    assert not s.is_due(3) and s.next_due(2) == 6
    r = Schedule(every_n_steps=3, start_step=1, max_profiles=3)
    r.load_state_dict(s.state_dict())
    assert r.taken == 2 and r.next_due(0) == 6
    r.mark(6)
    assert r.exhausted and r.next_due(0) == NEVER


def test_batch_index_stages_may_repeat_steps() -> None:
    s = Schedule(every_n_steps=2, start_step=0)
    s.mark(0)
    assert s.next_due(0) == 2
    assert s.next_due(0, ignore_last=True) == 0


@pytest.mark.parametrize(
    ("kwargs", "exc", "word"),
    [
        ({"every_n_steps": 0}, ValueError, "every_n_steps"),
        ({"every_n_steps": 2.5}, TypeError, "every_n_steps"),
        ({"every_n_steps": True}, TypeError, "every_n_steps"),
        ({"start_step": -1}, ValueError, "start_step"),
        ({"start_step": "10"}, TypeError, "start_step"),
        ({"max_profiles": -2}, ValueError, "max_profiles"),
        ({"profile_first": 1}, TypeError, "profile_first"),
        ({"every_n_steps": None, "profile_first": False}, ValueError, "profile_first"),
    ],
)
def test_invalid_arguments_name_the_argument(kwargs: dict, exc: type, word: str) -> None:
    with pytest.raises(exc, match=word):
        Schedule(**kwargs)


def test_stages() -> None:
    assert normalize_stages("train") == ("train",)
    assert normalize_stages(["train", "val", "test"]) == ("train", "validation", "test")
    with pytest.raises(ValueError, match="unknown stage 'eval'.*train, validation, test, predict"):
        normalize_stages(["eval"])
    with pytest.raises(ValueError, match="at least one"):
        normalize_stages([])
    with pytest.raises(TypeError, match="stages"):
        normalize_stages(3)  # type: ignore[arg-type]
