"""Pure tests of the one-shot prompt's token estimate, calibrated by replica counts."""

import pytest

from scheduler.token_estimate import PromptTokenEstimate


def test_default_ratio_until_enough_counts():
    e = PromptTokenEstimate(default_chars_per_token=3.0, min_observations=3)
    assert e.tokens(300) == 100
    e.observe(700, 100)
    e.observe(700, 100)
    assert e.tokens(300) == 100  # two counts: not enough yet
    e.observe(700, 100)
    assert e.tokens(700) == 100 and e.tokens(7000) == 1000


def test_long_prompts_weigh_more_and_old_counts_leave_the_window():
    e = PromptTokenEstimate(window=3, min_observations=1)
    e.observe(100, 50)      # 2 chars per token (short, dense)
    e.observe(9900, 1000)   # ~10 chars per token
    assert e.tokens(10_000) == 1050  # (50 + 1000) / 10,000 tokens per char
    e.observe(400, 100)
    e.observe(400, 100)     # the first count leaves a window of 3
    assert e.tokens(10_700) == 1200


def test_bad_counts_are_ignored_and_bad_settings_refused():
    e = PromptTokenEstimate(min_observations=1)
    e.observe(0, 10)
    e.observe(10, 0)
    assert e.tokens(30) == 10
    with pytest.raises(ValueError):
        PromptTokenEstimate(default_chars_per_token=0)
