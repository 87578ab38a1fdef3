"""A slot is a physical card: two slots that name one card are a host error, whether the host file says so in
itself (one UUID in two letter cases; an index beside a UUID where nothing can match them) or only NVML's answer
shows it (a slot by UUID and one by index that are the same card). Pure: captured-shape NVML answers, no GPU."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from reconciler.model import HostConfig
from reconciler.observe.gpu import parse_nvml
from unit.test_gpu_parse import TWO_GPUS, UUID_0, UUID_1, host, procs

A, B, C = "dark-compute-a", "dark-compute-b", "dark-compute-c"


# ---------------------------------------------------------------- the host file alone


def test_one_uuid_in_two_letter_cases_is_one_card() -> None:
    upper = "GPU-" + UUID_0[4:].upper()
    for telemetry in ("nvml", "none"):
        with pytest.raises(ValidationError) as exc:
            HostConfig(name="h", gpus={A: {"uuid": UUID_0}, B: {"uuid": upper}}, gpu_telemetry=telemetry)
        text = str(exc.value)
        assert f"GPU slots '{A}' and '{B}' both point at GPU {UUID_0}" in text
        assert "differ only in letter case" in text and "give each slot its own card" in text


def test_an_index_beside_a_uuid_is_refused_where_nothing_can_match_them() -> None:
    with pytest.raises(ValidationError) as exc:
        HostConfig(name="h", gpus={A: {"uuid": UUID_0}, B: {"index": 0}}, gpu_telemetry="none")
    text = str(exc.value)
    assert "gpu_telemetry is 'none'" in text
    assert f"'{A}' (uuid {UUID_0}) and '{B}' (index 0) may be one card" in text
    assert "set gpu_telemetry: nvml" in text
    # NVML can match them (and parse_nvml does); a slot that gives both ids fits beside either kind.
    HostConfig(name="h", gpus={A: {"uuid": UUID_0}, B: {"index": 0}}, gpu_telemetry="nvml")
    for other in ({"index": 1}, {"uuid": UUID_1}):
        HostConfig(name="h", gpus={A: {"index": 0, "uuid": UUID_0}, B: other}, gpu_telemetry="none")
    HostConfig(name="h", gpus={A: {"uuid": UUID_0}, B: {"uuid": UUID_1}}, gpu_telemetry="none")


# ---------------------------------------------------------------- NVML's answer


def _one_card_error(view: Any, *slots: str) -> str:
    assert not view.reading.ok, view.reading.detail
    detail = view.reading.detail
    assert detail.startswith("NVML: configs/host.yaml gpus: slots "), detail
    for s in slots:
        assert f"'{s}' (" in detail, detail
        assert "are one card" in view.slots[s].error
    return detail


def test_a_slot_by_uuid_and_one_by_index_on_the_same_card_make_the_source_unavailable() -> None:
    view = parse_nvml(TWO_GPUS, host({A: {"uuid": UUID_0}, B: {"index": 0}}), **procs({}))
    detail = _one_card_error(view, A, B)
    assert f"'{A}' (uuid {UUID_0}) and '{B}' (index 0) are one card, GPU 0 ({UUID_0})" in detail
    assert "give each slot its own card in configs/host.yaml" in detail
    # The same with no NVIDIA runtime: nothing in the parse depends on how GPUs reach the container.
    h = HostConfig(name="h", gpus={A: {"uuid": UUID_0}, B: {"index": 0}}, docker={"gpu_requests": False})
    assert parse_nvml(TWO_GPUS, h, **procs({})).reading.detail == detail


def test_only_the_slots_on_one_card_are_named() -> None:
    h = host({A: {"index": 1}, B: {"uuid": UUID_1}, C: {"index": 0}})
    view = parse_nvml(TWO_GPUS, h, **procs({}))
    _one_card_error(view, A, B)
    assert f"GPU 1 ({UUID_1})" in view.reading.detail
    assert view.slots[C].error == "" and f"'{C}'" not in view.reading.detail
    # A slot whose card is gone does not hide two that share the card still there.
    three = host({A: {"index": 0}, B: {"uuid": UUID_0}, C: {"uuid": UUID_1}})
    raw = {**TWO_GPUS, "devices": [TWO_GPUS["devices"][0]], "device_count": 1}
    view = parse_nvml(raw, three, **procs({}))
    _one_card_error(view, A, B)
    assert view.slots[C].missing


def test_a_uuid_in_other_letters_is_that_card_but_unusable_as_written() -> None:
    upper = "GPU-" + UUID_1[4:].upper()
    view = parse_nvml(TWO_GPUS, host({A: {"uuid": upper}}), **procs({}))
    s = view.slots[A]
    assert s.missing and view.reading.ok  # that slot alone, as a missing card would be
    assert f"uuid {upper} is GPU 1's uuid {UUID_1} in other letters; write it as NVML does" in s.error
    # Beside a slot that names the same card by index, it is still one card.
    view = parse_nvml(TWO_GPUS, host({A: {"uuid": upper}, B: {"index": 1}}), **procs({}))
    _one_card_error(view, A, B)


def test_slots_on_distinct_cards_stay_usable() -> None:
    for gpus in ({A: {"uuid": UUID_0}, B: {"index": 1}}, {A: {"index": 1}, B: {"uuid": UUID_0}}):
        view = parse_nvml(TWO_GPUS, host(gpus), **procs({}))
        assert view.reading.ok, view.reading.detail
        assert {s: v.index for s, v in view.slots.items()} == {s: (0 if "uuid" in g else 1) for s, g in gpus.items()}
