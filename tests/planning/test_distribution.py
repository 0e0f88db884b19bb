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


def test_bad_rules_say_what_is_expected() -> None:
    with pytest.raises(ValueError, match=r"expected 'all', 'gpu' or a comma-separated list"):
        DistributionRules.parse("gpu, ../x")


def test_refusals_say_what_to_set() -> None:
    assert "TRAINFEED_GPUS" in DistributionRules.parse("gpu").refusal("j", "w", "h", 0)
    assert "TRAINFEED_WORKER_NAME" in DistributionRules.parse("a,b").refusal("j", "w", "h", 0)
