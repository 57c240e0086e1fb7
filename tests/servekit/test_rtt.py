"""The one RTT table type (router scorer, simulator, local topology), and the measured RTT."""

from __future__ import annotations

import pydantic
import pytest

from geo_router.region_settings import RegionSettings
from servekit.rtt import MeasuredRtt, RttTable


def test_named_pairs_either_way_then_city_then_default() -> None:
    table = RttTable(rtt_ms={"a": {"b": 30, "a": 3}}, same_region_ms=1, default_ms=99)
    assert table.rtt("a", "b") == table.rtt("b", "a") == 30
    assert table.rtt("a", "a") == 3  # a measured diagonal wins over the city default
    assert table.rtt("b", "b") == 1
    assert table.rtt("a", "c") == 99
    assert table.one_way_s("a", "b") == pytest.approx(0.015)


def test_a_directed_pair_keeps_its_own_figure() -> None:
    table = RttTable(rtt_ms={"a": {"b": 30}, "b": {"a": 50}})
    assert (table.rtt("a", "b"), table.rtt("b", "a")) == (30, 50)


def test_the_router_settings_build_the_same_table_with_the_same_defaults() -> None:
    plain = RttTable(rtt_ms={"east": {"west": 70}})
    routed = RegionSettings(rtt_ms={"east": {"west": 70}}).rtt_table()
    assert routed == plain
    assert (plain.same_region_ms, plain.default_ms) == (1.0, 150.0)


def test_a_misspelt_field_fails_at_load() -> None:
    with pytest.raises(pydantic.ValidationError, match="same_city_ms"):
        RttTable.model_validate({"same_city_ms": 2})


def test_a_measured_rtt_is_the_least_of_the_recent_round_trips() -> None:
    rtt = MeasuredRtt(window=3)
    assert rtt.ms is None
    for ms in (9.0, 2.0, 5.0):  # the first paid for a connection; a poll met a busy loop
        rtt.add(ms)
    assert rtt.ms == 2.0
    for ms in (40.0, 41.0, 42.0):  # the path got longer: shown once the window has turned
        rtt.add(ms)
    assert rtt.ms == 40.0
