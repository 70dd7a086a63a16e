"""Rate profiles: parsing, burst/gradual shape, determinism for a seed, equal volume, error messages."""

import math

import pytest

from clasp.core.profiles import BURST_HIGH, BURST_LOW, GRADUAL_LEVELS, Profile, ProfileError, parse_profile

MAX = 1000.0


def test_gradual_shape():
    p = parse_profile("gradual", MAX, seed=3)
    assert [r for r, _ in p.stages] == [lv * MAX for lv in GRADUAL_LEVELS]
    assert [round(r / MAX, 1) for r, _ in p.stages] == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0,
                                                         0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]
    assert all(5 <= d <= 10 for _, d in p.stages)


@pytest.mark.parametrize("seed", range(40))
def test_burst_shape_and_equal_volume(seed):
    g = parse_profile("gradual", MAX, seed=seed)
    b = parse_profile("burst", MAX, seed=seed)
    assert math.isclose(sum(r * d for r, d in b.stages), sum(r * d for r, d in g.stages), rel_tol=1e-9)
    assert b.volume == g.volume
    lows = [BURST_LOW[0] * MAX - 1e-9 <= r <= BURST_LOW[1] * MAX + 1e-9 for r, _ in b.stages]
    highs = [BURST_HIGH[0] * MAX - 1e-9 <= r <= BURST_HIGH[1] * MAX + 1e-9 for r, _ in b.stages]
    assert all(lo != hi for lo, hi in zip(lows, highs, strict=True))
    # It jumps: consecutive stages alternate between the low and the high range.
    assert all(a != c for a, c in zip(lows, lows[1:], strict=False))
    assert all(5 <= d <= 10 for _, d in b.stages)


def test_deterministic_for_a_seed_and_different_across_seeds():
    for kind in ("burst", "gradual"):
        assert parse_profile(kind, MAX, seed=7) == parse_profile(kind, MAX, seed=7)
        assert parse_profile(kind, MAX, seed=7).stages != parse_profile(kind, MAX, seed=8).stages


def test_rate_at_and_sent_by():
    p = parse_profile("steps:100@2,50@3")
    assert p.stages == ((100.0, 2.0), (50.0, 3.0))
    assert p.duration == 5 and p.volume == 350
    assert p.rate_at(0) == 100 and p.rate_at(1.99) == 100 and p.rate_at(2) == 50 and p.rate_at(5) == 0.0
    assert p.sent_by(1) == 100 and p.sent_by(3) == 250 and p.sent_by(99) == 350
    assert p.scaled(10).stages == ((100.0, 4.0), (50.0, 6.0))


def test_constant_and_unthrottled():
    c = parse_profile("constant:250")
    assert c.rate_at(1e6) == 250 and math.isinf(c.duration) and c.volume is None
    assert parse_profile("constant:250", duration=4).volume == 1000
    u = parse_profile("unthrottled", duration=30)
    assert u.unthrottled and u.rate_at(3) is None and u.duration == 30 and u.volume is None
    assert isinstance(parse_profile(" Gradual ", MAX), Profile)


@pytest.mark.parametrize("text, needle", [
    ("foo", "unknown profile 'foo'"),
    ("", "empty profile"),
    ("constant", "constant needs a rate"),
    ("constant:abc", "is not a number"),
    ("constant:0", "must be > 0"),
    ("constant:-5", "must be > 0"),
    ("steps:", "steps needs"),
    ("steps:10@2,20", "is not RATE@SECONDS"),
    ("steps:10@0", "must be > 0"),
    ("steps:-1@3", "must be > 0"),
    ("burst:3", "takes no argument"),
])
def test_bad_strings_raise_one_line_with_accepted_forms(text, needle):
    with pytest.raises(ProfileError) as e:
        parse_profile(text, MAX)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg
    assert "unthrottled, constant:RATE, burst, gradual, steps:R1@S1" in msg
    assert isinstance(e.value, ValueError)


def test_burst_needs_a_max_rate():
    for bad in (None, 0, -1):
        with pytest.raises(ProfileError, match="max rate"):
            parse_profile("burst", bad)
