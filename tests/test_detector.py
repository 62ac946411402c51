import pytest

from host_agent.core import AccordionDetector, StaticSchedule
from host_agent.core.detector import Misclassifying


def test_static_schedule_defaults_to_the_notes_steps():
    det = StaticSchedule()
    assert [s for s in range(1, 21) if det.classify(s)] == [1, 2, 3, 20]
    assert [s for s in range(1, 6) if StaticSchedule(steps=5).classify(s)] == [1, 2, 3, 5]
    assert [
        s for s in range(1, 11) if StaticSchedule(steps=10, critical=frozenset({4})).classify(s)
    ] == [4]


def test_accordion_is_critical_until_norms_settle_and_again_on_a_jump():
    det = AccordionDetector(threshold=0.5)
    norms = [10.0, 4.0, 3.5, 3.4, 3.3, 8.0, 7.9]
    verdicts = [det.classify(step, n) for step, n in enumerate(norms, start=1)]
    # first interval: no history, critical; 10 -> 4 is a 60% change, critical;
    # then changes under 50%; 3.3 -> 8 is a 142% change, critical; 8 -> 7.9 settles.
    assert verdicts == [True, True, False, False, False, True, False]


def test_accordion_compares_accumulated_intervals():
    det = AccordionDetector(threshold=0.5, interval=2)
    verdicts = [det.classify(s, n) for s, n in enumerate([1, 1, 1, 1, 5, 5], start=1)]
    # intervals sum to 2, 2, 10: unchanged (not critical), then a 400% change
    assert verdicts == [True, True, True, False, False, True]


def test_accordion_without_a_norm_keeps_its_last_verdict():
    det = AccordionDetector()
    det.classify(1, 1.0)
    det.classify(2, 1.0)
    assert det.classify(3) is False


def test_accordion_rejects_bad_input():
    with pytest.raises(ValueError, match="threshold"):
        AccordionDetector(threshold=0)
    with pytest.raises(ValueError, match="norm"):
        AccordionDetector().classify(1, -1.0)


def test_a_misclassifying_detector_flips_only_the_steps_it_gets_wrong():
    detector = Misclassifying(StaticSchedule(steps=20), frozenset({1, 5}))
    verdicts = [detector.classify(step) for step in range(1, 21)]
    assert [s for s, v in zip(range(1, 21), verdicts, strict=True) if v] == [2, 3, 5, 20]
