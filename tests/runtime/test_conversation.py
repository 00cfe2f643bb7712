"""What auto-save may summarize, what prefetch may search, what a summary may yield (R22, R24)."""

from __future__ import annotations

import json

import pytest
from google.adk.events import Event
from google.genai import types

from kagent_memory_governed.adk.conversation import (
    SUMMARY_MARKER,
    clip_utf8,
    conversation_tail,
    facts_from_summary,
    subqueries,
    summary_request,
)
from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.policy import Policy


def event(author: str, *parts: types.Part, invocation: str = "i1") -> Event:
    role = "user" if author == "user" else "model"
    return Event(invocation_id=invocation, author=author, content=types.Content(role=role, parts=list(parts)))


def test_clipping_never_splits_a_character() -> None:
    assert clip_utf8("é" * 10, 5) == "éé"
    assert clip_utf8("é" * 10, 5, keep_end=True) == "éé"
    assert clip_utf8("short", 512) == "short"
    assert len(clip_utf8("😀" * 200, 512).encode()) <= 512


def test_the_tail_keeps_user_and_agent_text_only_and_its_last_bytes() -> None:
    events = [
        event("user", types.Part(text="first message")),
        event("helper", types.Part(function_call=types.FunctionCall(name="load_memory", args={"query": "q"}))),
        event(
            "helper",
            types.Part(function_response=types.FunctionResponse(name="load_memory", response={"r": "recalled"})),
        ),
        event("system", types.Part(text="header update")),
        event("helper", types.Part(text="an answer")),
        event("user", types.Part(text="x" * 100)),
    ]
    tail = conversation_tail(events, 16384, {"i1": False})
    assert tail.splitlines() == ["user: first message", "assistant: an answer", "user: " + "x" * 100]
    assert "recalled" not in tail and "load_memory" not in tail and "header" not in tail
    assert conversation_tail(events, 50, {"i1": False}) == "x" * 50
    assert len(conversation_tail([event("user", types.Part(text="y" * 40000))], 16384, {"i1": False})) == 16384


def test_the_tail_holds_collected_turns_only_and_no_agent_text_of_a_turn_that_recalled() -> None:
    events = [
        event("user", types.Part(text="said without consent"), invocation="before"),
        event("helper", types.Part(text="reply before"), invocation="before"),
        event("user", types.Part(text="I drink lapsang"), invocation="plain"),
        event("helper", types.Part(text="noted"), invocation="plain"),
        event("user", types.Part(text="what do I drink?"), invocation="recall"),
        event("helper", types.Part(text="you drink lapsang, as remembered"), invocation="recall"),
    ]
    tail = conversation_tail(events, 16384, {"plain": False, "recall": True})
    assert tail.splitlines() == ["user: I drink lapsang", "assistant: noted", "user: what do I drink?"]
    assert conversation_tail(events, 16384, {}) == ""


def test_prefetch_uses_at_most_eight_subqueries_of_at_most_512_bytes() -> None:
    sentences = [f"This is sentence number {n} about my many preferences." for n in range(20)]
    queries = subqueries(" ".join(sentences), Policy())
    assert queries == sentences[:8]
    long = subqueries("é" * 2000, Policy())
    assert len(long) == 1 and len(long[0].encode()) <= 512
    assert subqueries("hi", Policy()) == ["hi"]
    assert subqueries("   ", Policy()) == []
    assert len(subqueries(" ".join(sentences), Policy(prefetch_max_subqueries=3))) == 3


def test_a_summary_yields_at_most_ten_storable_facts() -> None:
    items = [f"fact {n}" for n in range(12)] + ["z" * 513, "", "fact 0"]
    facts, dropped = facts_from_summary(json.dumps(items), Policy())
    assert facts == [f"fact {n}" for n in range(10)]
    assert dropped == 1
    fenced = facts_from_summary('```json\n["a", "b"]\n```', Policy())
    assert fenced == (["a", "b"], 0)


@pytest.mark.parametrize("output", ["not json", '{"a": 1}', "[1]", '["a", 2]', "", "```", "[" * 10000])
def test_malformed_summaries_are_refused_whole(output: str) -> None:
    with pytest.raises(GovernedMemoryError) as refused:
        facts_from_summary(output, Policy())
    assert refused.value.reason is Reason.MALFORMED_SUMMARY
    assert str(refused.value) == "malformed_summary"


def test_the_summary_request_asks_for_a_bounded_json_list() -> None:
    request = summary_request("user: hello", Policy(autosave_max_facts=4), "gpt-4o-mini")
    parts = request.contents[0].parts
    assert parts is not None
    prompt = parts[0].text
    assert prompt is not None
    assert prompt.endswith(SUMMARY_MARKER) and "At most 4 facts" in prompt and "user: hello" in prompt
    assert request.model == "gpt-4o-mini"  # google-adk's Gemini sends the request's model, not its own
