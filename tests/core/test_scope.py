from __future__ import annotations

import pytest

from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.scope import AgentId, ControlRoom, Origin, Principal, ScopeKey


@pytest.mark.parametrize(
    "mxid",
    [
        "alice",  # bare localpart
        "@alice",  # no server
        "alice:example.org",  # no sigil
        "#alice:example.org",  # wrong sigil
        "@:example.org",
        "@Alice:example.org",  # upper case is not a valid modern localpart
        "@аlice:example.org",  # Cyrillic a, a confusable
        "@alice:exa mple.org",
        "@alice:example.org\x00",
        "@alice:-example.org",
        "@" + "a" * 250 + ":example.org",  # over 255 bytes
        "",
        None,
        42,
    ],
)
def test_an_incomplete_or_malformed_mxid_is_refused(mxid: object) -> None:
    with pytest.raises(GovernedMemoryError) as refused:
        Principal.parse(mxid, "native")
    assert refused.value.reason is Reason.BAD_INPUT
    assert str(refused.value) == "bad_input"


@pytest.mark.parametrize("mxid", ["@alice:example.org", "@a.b_c=d-e/f+g:matrix.example.org:8448", "@bob:[::1]:8448"])
def test_complete_mxids_are_admitted(mxid: str) -> None:
    assert Principal.parse(mxid, "native").mxid == mxid


def test_an_unknown_origin_is_refused() -> None:
    with pytest.raises(GovernedMemoryError):
        Principal.parse("@alice:example.org", "federated")


def test_the_same_mxid_under_another_origin_is_another_principal() -> None:
    native = Principal.parse("@alice:example.org", "native")
    bridged = Principal.parse("@alice:example.org", "appservice")
    assert native != bridged
    agent, room = AgentId.parse("kagent/helper"), ControlRoom.parse("!r:example.org")
    assert ScopeKey(native, agent, room).scope_id != ScopeKey(bridged, agent, room).scope_id
    assert bridged.origin is Origin.APPSERVICE


def test_scope_ids_are_stable_and_distinct_per_key() -> None:
    alice = Principal.parse("@alice:example.org", "native")
    key = ScopeKey(alice, AgentId.parse("kagent/helper"), ControlRoom.parse("!r:example.org"))
    same = ScopeKey(
        Principal.parse("@alice:example.org", "native"),
        AgentId.parse("kagent/helper"),
        ControlRoom.parse("!r:example.org"),
    )
    assert key.scope_id == same.scope_id
    others = {
        ScopeKey(alice, AgentId.parse("kagent/other"), key.room).scope_id,
        ScopeKey(alice, AgentId.parse("other/helper"), key.room).scope_id,
        ScopeKey(alice, key.agent, ControlRoom.parse("!s:example.org")).scope_id,
    }
    assert key.scope_id not in others and len(others) == 3


@pytest.mark.parametrize("value", ["kagent/helper", "team-a/agent.v2"])
def test_agent_identity_is_namespace_slash_name(value: str) -> None:
    assert str(AgentId.parse(value)) == value


@pytest.mark.parametrize(
    "value", ["helper", "kagent__NS__helper", "a/b/c", "Kagent/helper", "/helper", "kagent/", "-x/y"]
)
def test_other_agent_identities_are_refused(value: str) -> None:
    with pytest.raises(GovernedMemoryError):
        AgentId.parse(value)


@pytest.mark.parametrize("room", ["!abc:example.org", "!AbC_-123=:matrix.org:8448", "!" + "A" * 43])
def test_room_ids_of_every_room_version_are_admitted(room: str) -> None:
    assert str(ControlRoom.parse(room)) == f"control-room:{room}"


@pytest.mark.parametrize("room", ["#alias:example.org", "abc:example.org", "!", "!a b:example.org", "!x:" + "e" * 260])
def test_other_room_references_are_refused(room: str) -> None:
    with pytest.raises(GovernedMemoryError):
        ControlRoom.parse(room)
