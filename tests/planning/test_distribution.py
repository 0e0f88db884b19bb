from __future__ import annotations

import pytest

from trainfeed.planning.distribution import DistributionRules


def test_rules_parse_and_admit() -> None:
    assert DistributionRules.parse(None).admits("w", 0)
    assert DistributionRules.parse("all").admits("w", 0)
    gpu = DistributionRules.parse("gpu")
    assert gpu.admits("w", 2) and not gpu.admits("w", 0)
    named = DistributionRules.parse("node-1, node-2")
    assert str(named) == "node-1,node-2"
    assert named.admits("node-2", 0) and not named.admits("node-3", 8)
    assert DistributionRules.parse(str(named)) == named  # round trip through job state


@pytest.mark.parametrize("text,kind", [("all_segments", "all"), ("ALL_SEGMENTS", "all"),
                                       ("gpu_segments", "gpu"), ("Gpu_Segments", "gpu"),
                                       ("all", "all"), ("gpu", "gpu"), ("", "all")])
def test_madlibs_spellings_are_the_keyword_rules(text: str, kind: str) -> None:
    # training_preprocessor_dl documents 'all_segments' (its default) and 'gpu_segments', and
    # lower-cases what it is given; they are rules, not the name of one worker.
    rules = DistributionRules.parse(text)
    assert rules == DistributionRules(kind)
    assert rules.admits("any-worker", 1)
    assert DistributionRules.parse(str(rules)) == rules


def test_what_madlibs_summary_stores() -> None:
    assert DistributionRules.parse("all").madlib_value == "all_segments"
    assert DistributionRules.parse("all").gpu_config == "all_segments"
    assert DistributionRules.parse("gpu").madlib_value == "gpu_segments"
    named = DistributionRules.parse("node-b,node-a")
    assert named.madlib_value == named.gpu_config == ["node-a", "node-b"]
    # a summary's list of names parses back to the same rules
    assert DistributionRules.parse(named.madlib_value) == named
    assert DistributionRules.parse(["node-a"]).admits("node-a", 0)


def test_bad_rules_say_what_is_expected() -> None:
    with pytest.raises(ValueError, match=r"expected 'all' \('all_segments'\), 'gpu' "
                                         r"\('gpu_segments'\) or a comma-separated list"):
        DistributionRules.parse("gpu, ../x")
    with pytest.raises(ValueError, match="an empty list"):
        DistributionRules.parse([])


def test_refusals_say_what_to_set() -> None:
    assert "TRAINFEED_GPUS" in DistributionRules.parse("gpu").refusal("j", "w", "h", 0)
    assert "TRAINFEED_WORKER_NAME" in DistributionRules.parse("a,b").refusal("j", "w", "h", 0)
