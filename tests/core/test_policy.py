from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import asyncpg
import numpy
import pytest

from kagent_memory_governed.errors import GovernedMemoryError, PolicyError, Reason
from kagent_memory_governed.policy import CEILINGS, Policy, admit_embedding, admit_fact, expiry_seconds
from kagent_memory_governed.settings import Settings
from kagent_memory_governed.store import Store


def test_the_default_policy_is_the_ceilings() -> None:
    policy = Policy()
    assert {key: getattr(policy, key) for key in CEILINGS} == {key: ceiling for key, (ceiling, _) in CEILINGS.items()}
    assert (policy.max_expiry_seconds, policy.entry_cap, policy.max_fact_bytes) == (604800, 100, 512)


def test_a_policy_may_lower_every_ceiling() -> None:
    policy = Policy.from_mapping({"max_expiry_seconds": 3600, "entry_cap": 10, "max_fact_bytes": 100})
    assert (policy.max_expiry_seconds, policy.entry_cap, policy.max_fact_bytes) == (3600, 10, 100)


@pytest.mark.parametrize(("key", "ceiling"), [(k, c) for k, (c, d) in CEILINGS.items() if d == "max"])
def test_raising_a_ceiling_is_refused_naming_the_key(key: str, ceiling: int) -> None:
    with pytest.raises(PolicyError, match=f"^{key}:"):
        Policy.from_mapping({key: ceiling + 1})


def test_the_autosave_interval_is_a_floor() -> None:
    assert Policy.from_mapping({"autosave_every_user_turns": 10}).autosave_every_user_turns == 10
    with pytest.raises(PolicyError, match="^autosave_every_user_turns:"):
        Policy.from_mapping({"autosave_every_user_turns": 4})


def test_ledger_retention_may_be_lowered_to_thirty_days_and_no_further() -> None:
    assert Policy().ledger_retention_days == 400
    assert Policy.from_mapping({"ledger_retention_days": 30}).ledger_retention_days == 30
    for value in (29, 401, 0):
        with pytest.raises(PolicyError, match="^ledger_retention_days:"):
            Policy.from_mapping({"ledger_retention_days": value})


def test_a_policy_file_with_too_short_a_ledger_retention_stops_start_up(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"ledger_retention_days": 7}))
    with pytest.raises(PolicyError, match="^ledger_retention_days: 7 is below its minimum 30$"):
        Settings(policy=path).load_policy()


@pytest.mark.parametrize("value", ["50", 50.0, True, None, [50], 0, -1])
def test_a_wrong_type_or_non_positive_value_is_refused(value: object) -> None:
    with pytest.raises(PolicyError, match="^entry_cap:"):
        Policy.from_mapping({"entry_cap": value})


def test_an_unknown_key_is_refused_by_name() -> None:
    with pytest.raises(PolicyError, match="^ttl_days: unknown policy key"):
        Policy.from_mapping({"ttl_days": 3})


def test_a_policy_file_is_read_and_validated(tmp_path: Path) -> None:
    good = tmp_path / "policy.json"
    good.write_text(json.dumps({"entry_cap": 20}))
    assert Policy.from_file(good).entry_cap == 20
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(PolicyError, match="^policy:"):
        Policy.from_file(bad)
    with pytest.raises(PolicyError, match="^policy:"):
        Policy.from_file(tmp_path / "missing.json")
    array = tmp_path / "array.json"
    array.write_text("[]")
    with pytest.raises(PolicyError, match="^policy: must be a JSON object"):
        Policy.from_file(array)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('{"entry_cap": 200, "entry_cap": 10}', "^entry_cap: appears more than once$"),
        ('{"entry_cap": NaN}', "^policy: NaN is not JSON$"),
        ('{"entry_cap": -Infinity}', "^policy: -Infinity is not JSON$"),
        ("[" * 100_000 + "]" * 100_000, "^policy: file is larger than 65536 bytes$"),
        ("[" * 30_000 + "]" * 30_000, "^policy: nested too deeply$"),
        ('{"entry_cap": 10,}', r"^policy: not JSON \(line 1, column 18\)$"),
        ('{"a\\nb": 1}', r'^"a\\nb": unknown policy key$'),
        (
            '{"autosave_every_user_turns": 1000000000000000000000000}',
            "^autosave_every_user_turns: .* above its maximum",
        ),
    ],
)
def test_a_policy_file_is_parsed_as_strictly_as_a_control_body(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "policy.json"
    path.write_text(text)
    with pytest.raises(PolicyError, match=error) as refused:
        Policy.from_file(path)
    assert "\n" not in str(refused.value)


def test_the_autosave_cadence_may_be_raised_to_a_thousand_turns_and_no_further() -> None:
    assert Policy.from_mapping({"autosave_every_user_turns": 1000}).autosave_every_user_turns == 1000
    with pytest.raises(PolicyError, match="^autosave_every_user_turns: 1001 is above its maximum 1000$"):
        Policy.from_mapping({"autosave_every_user_turns": 1001})


def test_a_fact_of_512_utf8_bytes_is_admitted_and_513_refused() -> None:
    policy = Policy()
    assert admit_fact("a" * 512, policy)
    assert admit_fact("é" * 256, policy)  # two bytes each
    for too_large in ("a" * 513, "é" * 256 + "a", "€" * 171, "😀" * 128 + "a"):
        with pytest.raises(GovernedMemoryError) as refused:
            admit_fact(too_large, policy)
        assert refused.value.reason is Reason.FACT_TOO_LARGE


def test_a_lowered_fact_size_is_enforced() -> None:
    with pytest.raises(GovernedMemoryError):
        admit_fact("a" * 101, Policy(max_fact_bytes=100))


@pytest.mark.parametrize("fact", ["", "   ", "nul\x00byte", "lone \ud800 surrogate", None, b"bytes"])
def test_unstorable_facts_are_bad_input(fact: object) -> None:
    with pytest.raises(GovernedMemoryError) as refused:
        admit_fact(fact, Policy())
    assert refused.value.reason is Reason.BAD_INPUT


FLOAT32_MAX = float(numpy.finfo(numpy.float32).max)


@pytest.mark.parametrize(
    "vector",
    [
        [1.0] * 767,
        [1.0] * 769,
        [0.0] * 768,
        [math.nan] + [1.0] * 767,
        [math.inf] * 768,
        ["x"] * 768,
        None,
        ["0.5"] * 768,  # numbers as text: numpy would read them as numbers
        [True] * 768,
        [0.5] * 767 + [True],  # one boolean among numbers: numpy would make it 1.0
        [[0.5]] * 768,
        {"vector": [0.5] * 768},
        "0.5" * 768,
        numpy.array(["0.5"] * 768),
        [FLOAT32_MAX] * 768,  # finite, but its norm is not: never found, yet it would count toward the cap
        [1e19] * 768,
        [1e-30] * 768,  # its squares vanish in single precision: no direction
    ],
)
def test_embeddings_must_be_768_numbers_with_a_usable_norm(vector: object) -> None:
    with pytest.raises(GovernedMemoryError) as refused:
        admit_embedding(vector)
    assert refused.value.reason is Reason.BAD_INPUT


@pytest.mark.parametrize(
    "vector", [[0.5] * 768, [1] * 768, numpy.full(768, 0.25, numpy.float32), [1e19] + [0.0] * 767, [1e-19] * 768]
)
def test_embeddings_of_numbers_whose_norm_pgvector_can_compute_are_admitted(vector: object) -> None:
    stored = admit_embedding(vector)
    assert stored.dtype == numpy.float32 and stored.shape == (768,)


async def test_every_admitted_extreme_embedding_is_found_by_itself(store: Store, sql: asyncpg.Connection) -> None:
    for vector in ([1e19] + [0.0] * 767, [1e-19] * 768, [0.5] * 768):
        text = str([float(x) for x in admit_embedding(vector)])
        assert await sql.fetchval("SELECT $1::vector <=> $1::vector", text) == 0.0  # a real pgvector
    text = str([FLOAT32_MAX] * 768)
    assert math.isnan(await sql.fetchval("SELECT $1::vector <=> $1::vector", text))  # why it is refused


def test_expiry_is_the_smallest_of_request_policy_and_consent() -> None:
    policy = Policy(max_expiry_seconds=3600)
    assert expiry_seconds(None, policy, 604800) == 3600
    assert expiry_seconds(None, Policy(), 600) == 600
    assert expiry_seconds(60, policy, 604800) == 60
    assert expiry_seconds(10**9, policy, 604800) == 3600
    wrong: tuple[Any, ...] = (0, -5, True, 1.5)  # a bool and a float too: what an untyped caller may send
    for bad in wrong:
        with pytest.raises(GovernedMemoryError):
            expiry_seconds(bad, policy, 604800)


def test_facts_are_stored_with_their_whitespace_normalized() -> None:
    assert admit_fact("  I drink\n\tlapsang   souchong \u00a0", Policy()) == "I drink lapsang souchong"
    assert admit_fact("a" * 512 + "   ", Policy()) == "a" * 512  # trailing whitespace does not count
