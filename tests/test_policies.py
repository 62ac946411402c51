import pytest

from host_agent.policies import P_HIGH, P_LOW, is_shed, parse_policy, shed_draw


@pytest.mark.parametrize(
    ("name", "receiver", "shed"),
    [
        ("dcqcn", (0.0, 0.0), False),
        ("tight", (P_LOW, P_LOW), False),
        ("forgive", (P_LOW, P_HIGH), False),
        ("forgive-full-budget", (P_LOW, P_HIGH), False),
        ("forgive-no-exemption", (P_LOW, P_HIGH), False),
        ("shed", (0.0, 0.0), True),
        ("loose", (0.0, 0.0), True),
    ],
)
def test_named_policies(name, receiver, shed):
    policy = parse_policy(name)
    assert policy.receiver_probabilities == receiver
    assert policy.shed is shed


def test_variants_differ_only_where_named():
    assert parse_policy("forgive-full-budget").vesting is False
    assert parse_policy("forgive-no-exemption").exemption is False
    assert parse_policy("forgive").vesting and parse_policy("forgive").exemption
    assert parse_policy("forgive-P0.25").forgive_prob == 0.25
    assert parse_policy("forgive-P0").forgive_prob == 0.0
    assert parse_policy("loose").step_probability(True) == P_HIGH
    assert parse_policy("shed").step_probability(True) == P_LOW


@pytest.mark.parametrize("name", ["fast", "forgive-P1.5", "forgive-P", "Forgive", ""])
def test_unknown_policy_is_one_line(name):
    with pytest.raises(ValueError) as info:
        parse_policy(name)
    assert "\n" not in str(info.value)


def test_shed_draw_is_shared_and_near_its_probability():
    assert shed_draw(7, 3, 99) == shed_draw(7, 3, 99)
    assert shed_draw(7, 3, 99) != shed_draw(8, 3, 99)
    policy = parse_policy("shed")
    shed = sum(is_shed(policy, 1, 5, flow, critical=False) for flow in range(20000))
    assert 0.08 < shed / 20000 < 0.12
    assert not any(is_shed(parse_policy("forgive"), 1, 5, f, False) for f in range(1000))
