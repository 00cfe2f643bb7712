"""The conversation boundary, through upstream's real KAgentApp with a recording controller (R36, R37, R38):
auto-save collects only turns admitted under its scope and generation, each once; recalled memory reaches
the model for the invocation that recalled it and nothing kagent keeps; a provider's error text never
leaves memory work."""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from controller import FakeController
from google.adk.models.llm_request import LlmRequest
from kagent.adk.models._openai import OpenAI
from openai import AsyncOpenAI

from kagent_memory_governed.adk.boundary import placeholder
from kagent_memory_governed.assertion import verify
from kagent_memory_governed.clock import now
from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.store import Store
from kagent_memory_governed.testing import (
    HOMESERVER,
    A2AClient,
    Bridge,
    ScriptedModel,
    build_app,
    new_context,
    reply_text,
    system_instruction,
)

if TYPE_CHECKING:
    from kagent_memory_governed import Runtime

ALICE = f"@alice:{HOMESERVER}"
TEA = "my favourite tea is a smoky lapsang souchong"
QUESTION = "Which tea should you brew for me this afternoon, given my favourite tea?"


def facts_said(conversation: str) -> list[str]:
    """The scripted summarizer: every ``fact: ...`` said in the conversation it was given."""
    return [match.strip() for match in re.findall(r"fact: ([^\n]+)", conversation)]


def recall_on_questions(text: str) -> list[tuple[str, dict[str, str]]]:
    return [("load_memory", {"query": text})] if text.endswith("?") else []


@dataclass
class Conversation:
    """One kagent session, spoken in as the bridge would, with the control API beside it."""

    http: httpx.AsyncClient
    bridge: Bridge
    context: str
    generation: int = 1
    streaming: bool = False

    async def say(self, text: str, *, header: bool = True, generation: int | None = None) -> str:
        scope = self.bridge.sign(time.time(), gen=generation or self.generation) if header else None
        agent = A2AClient(self.http)
        if self.streaming:
            return await agent.stream(text, context_id=self.context, user=ALICE, scope=scope)
        return reply_text(await agent.send(text, context_id=self.context, user=ALICE, scope=scope))

    async def control(self, method: str, path: str, op: str, body: dict[str, object] | None = None) -> dict[str, Any]:
        token = self.bridge.sign(time.time(), "control", op=op)
        answer = await self.http.request(
            method, f"/memory/v1/{path}", json=body, headers={"Authorization": f"Bearer {token}"}
        )
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = answer.json()
        self.generation = found.get("generation", self.generation)
        return found

    async def entries(self) -> list[dict[str, Any]]:
        listed: list[dict[str, Any]] = (await self.control("GET", "entries", "entries"))["entries"]
        return listed


@pytest.fixture
def model() -> ScriptedModel:
    return ScriptedModel().script(on_user=lambda text: [], summary=facts_said)


@pytest.fixture
async def conversation(
    runtime: Runtime, controller: FakeController, model: ScriptedModel, bridge: Bridge
) -> AsyncIterator[Conversation]:
    app = build_app(model, local=False, streaming=True)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as http:
        yield Conversation(http, bridge, new_context())
    await runtime.service.drain()


async def turns(conversation: Conversation, runtime: Runtime, texts: list[str], **options: Any) -> None:
    for text in texts:
        await conversation.say(text, **options)
    await runtime.service.drain()


def contents(request: LlmRequest) -> str:
    """Everything a model request carries in its contents, as JSON text."""
    return json.dumps([content.model_dump(mode="json") for content in request.contents])


def summarized(model: ScriptedModel) -> str:
    return "\n".join(contents(request) for request in model.summaries)


async def test_auto_save_collects_what_was_said_under_consent_and_nothing_else(
    runtime: Runtime, conversation: Conversation, model: ScriptedModel
) -> None:
    await conversation.say("fact: I was born in Lisbon", header=False)
    await conversation.say("fact: my sister is called Ana")  # a valid header, before consent
    await conversation.control("POST", "consent", "consent", {"purpose": "assist", "policy_version": "v1"})
    await turns(conversation, runtime, ["fact: I drink lapsang souchong", "how are you", "fine", "and you", "ok"])
    assert [entry["text"] for entry in await conversation.entries()] == ["I drink lapsang souchong"]
    assert len(model.summaries) == 1
    assert "Lisbon" not in summarized(model) and "Ana" not in summarized(model)  # never even summarized


async def test_a_fact_said_again_is_stored_once_with_its_first_expiry(
    runtime: Runtime, conversation: Conversation, model: ScriptedModel
) -> None:
    await conversation.control("POST", "consent", "consent", {"purpose": "assist", "policy_version": "v1"})
    await turns(conversation, runtime, ["fact: I drink lapsang souchong", "a", "b", "c", "d"])
    [first] = await conversation.entries()
    await turns(conversation, runtime, ["fact: I drink  lapsang\tsouchong ", "e", "f", "g", "h"])
    assert len(model.summaries) == 2 and "lapsang" in contents(model.summaries[1])
    assert await conversation.entries() == [first]  # same id, same expires_at


async def test_turns_said_before_an_erasure_or_while_off_are_never_collected(
    runtime: Runtime, conversation: Conversation, model: ScriptedModel, store: Store
) -> None:
    await conversation.control("POST", "consent", "consent", {"purpose": "assist", "policy_version": "v1"})
    await turns(conversation, runtime, ["fact: I drink lapsang souchong", "a", "b", "c", "d"])
    [entry] = await conversation.entries()
    await conversation.say("fact: I drink lapsang souchong")  # said again, then forgotten before collection
    await conversation.control("DELETE", f"entries/{entry['id']}", "forget")
    await turns(conversation, runtime, ["e", "f", "g", "h", "i"])
    assert len(model.summaries) == 2 and "lapsang" not in contents(model.summaries[1])
    assert await conversation.entries() == []

    stale = conversation.generation
    await conversation.control("POST", "off", "off", {"confirm": True})
    pin = "fact: my PIN is SENTINEL-PIN-4711"  # not digits alone: a timestamp may hold them
    await turns(conversation, runtime, [pin, pin], generation=stale)
    await turns(conversation, runtime, [pin])  # signed with the generation off returned
    await conversation.control("POST", "consent", "consent", {"purpose": "assist", "policy_version": "v2"})
    await turns(conversation, runtime, ["j", "k", "l", "m", "n"])
    assert len(model.summaries) == 3 and "SENTINEL-PIN" not in summarized(model)
    assert await conversation.entries() == []


async def test_the_agent_text_of_a_turn_that_recalled_is_not_collected(
    runtime: Runtime, conversation: Conversation, model: ScriptedModel, store: Store, bridge: Bridge
) -> None:
    await conversation.control("POST", "consent", "consent", {"purpose": "assist", "policy_version": "v1"})
    await turns(conversation, runtime, [f"fact: {TEA}", "a", "b", "c", "d"])
    [first] = await conversation.entries()
    model.script(on_user=recall_on_questions, tool_reply="fact: you like smoky lapsang tea, as I remember")
    await turns(conversation, runtime, [QUESTION, "e", "f", "g", "h"])
    assert "smoky lapsang tea" not in summarized(model)  # the restatement of a recalled fact
    assert await conversation.entries() == [first]


def recalled_in(request: LlmRequest) -> str:
    return system_instruction(request) + contents(request)


@pytest.mark.parametrize("streaming", [False, True], ids=["message/send", "message/stream"])
async def test_recalled_memory_reaches_this_invocations_model_requests_only(
    runtime: Runtime, conversation: Conversation, model: ScriptedModel, controller: FakeController, streaming: bool
) -> None:
    conversation.streaming = streaming
    await conversation.control("POST", "consent", "consent", {"purpose": "assist", "policy_version": "v1"})
    await turns(conversation, runtime, [f"fact: {TEA}", "a", "b", "c", "d"])
    assert [entry["text"] for entry in await conversation.entries()] == [TEA]

    model.script(on_user=recall_on_questions, tool_reply="Brewing it now.")
    conversation.context = new_context()  # a new session: its first message is prefetched, then load_memory
    asked, received = len(model.chats), len(controller.bodies)
    answer = await conversation.say(QUESTION)
    prefetched, loaded = model.chats[asked:]
    assert "lapsang" in system_instruction(prefetched)  # prefetch
    assert "lapsang" in contents(loaded) and "lapsang" not in system_instruction(loaded)  # load_memory
    assert "lapsang" not in answer  # the A2A answer carries the placeholder
    assert placeholder(1) in answer  # the placeholder, with its count
    assert not controller.received("lapsang", since=received)  # session events, tasks: nothing of it was kept

    await conversation.control("POST", "forget-all", "forget-all", {"confirm": True})
    before = len(model.chats)
    await conversation.say("And what about tomorrow?", header=False)  # the same session, memory-free
    assert model.chats[before:] and not any("lapsang" in recalled_in(r) for r in model.chats[before:])


SENTINEL = "PROVIDER-BODY-SENTINEL-8d1f"


def failing_provider(seen: list[httpx.Request]) -> OpenAI:
    """kagent's real OpenAI adapter over a provider that answers 500 with a body quoting the prompt."""

    def provider(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        prompt = json.loads(request.content)["messages"][0]["content"]
        return httpx.Response(500, json={"error": {"message": f"{SENTINEL} overloaded; prompt was: {prompt}"}})

    model = OpenAI(type="openai", model="gpt-4o-mini", api_key="test-key")
    model.__dict__["_client"] = AsyncOpenAI(
        api_key="test-key",
        base_url="http://provider.invalid/v1",
        max_retries=0,
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(provider)),
    )
    return model


@pytest.mark.parametrize("streaming", [False, True], ids=["message/send", "message/stream"])
async def test_a_provider_failure_inside_memory_work_answers_a_reason_code_only(
    runtime: Runtime, controller: FakeController, store: Store, bridge: Bridge, streaming: bool
) -> None:
    key = verify(bridge.sign(time.time()), bridge.trust(), now=now(), user_id=ALICE).key
    assert key is not None  # only an offboarding token names no scope
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    from support import facts

    await store.write(key, generation, facts(TEA))
    seen: list[httpx.Request] = []
    app = build_app(failing_provider(seen), local=False, streaming=True)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as http:
        conversation = Conversation(http, bridge, new_context(), generation, streaming)
        answer = await conversation.say(QUESTION)
    assert seen and "lapsang" in seen[0].content.decode()  # the provider got the prefetched fact, and failed
    assert SENTINEL not in answer and "lapsang" not in answer
    assert "model_failed" in answer
    assert not controller.received(SENTINEL) and not controller.received("lapsang")


async def test_a_store_failure_at_the_end_of_a_turn_leaves_the_chat_running_and_collects_nothing(
    runtime: Runtime, conversation: Conversation, model: ScriptedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    await conversation.control("POST", "consent", "consent", {"purpose": "assist", "policy_version": "v1"})

    async def unavailable(*args: object, **kwargs: object) -> None:
        raise GovernedMemoryError(Reason.STORE_UNAVAILABLE)

    monkeypatch.setattr(runtime.store, "record_turn", unavailable)
    for text in ["fact: I drink lapsang souchong", "a", "b", "c", "d"]:
        assert '"state": "completed"' in await conversation.say(text)
    await runtime.service.drain()
    assert model.summaries == [] and await conversation.entries() == []
