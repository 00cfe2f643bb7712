"""Memory as the provider receives it (R37, R38, R39): every memory path through kagent's real model adapters,
asserted on the raw HTTP bodies a loopback provider receives from upstream's real ``KAgentApp``.

For each adapter of the running kagent-adk release, sent whole (``message/send``) and streamed
(``message/stream`` with the provider streaming): prefetch reaches the system text of the first request;
``load_memory``'s hits reach the tool message of the next request as upstream's JSON text; a later turn reads
the placeholder and nothing recalled; no hits and a refusal are readable text; the summarizer's request holds
the admitted conversation; a provider failure answers ``model_failed`` and its body reaches no answer, no
controller request and no log record.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx
import pytest
from controller import FakeController
from providers import Adapter, Failure, Provider, Reply, Script, ToolCall, View, available
from support import facts

from kagent_memory_governed.adk.boundary import placeholder
from kagent_memory_governed.assertion import verify
from kagent_memory_governed.clock import now
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.store import Store
from kagent_memory_governed.testing import CONFIG, HOMESERVER, A2AClient, Bridge, build_app, new_context

if TYPE_CHECKING:
    from kagent_memory_governed import Runtime

ALICE = f"@alice:{HOMESERVER}"
TEA = "my favourite tea is a smoky lapsang souchong"
RECALLED = "lapsang"  # a word of TEA and of nothing else said
QUESTION = "Which tea should you brew for me this afternoon, given my favourite tea?"
SENTINEL = "PROVIDER-BODY-SENTINEL-5c2e"
MODES = [pytest.param(False, id="message/send"), pytest.param(True, id="message/stream")]


def said_facts(conversation: str) -> list[str]:
    """The scripted summarizer: every ``fact: ...`` said in the conversation it was given."""
    return [match.strip() for match in re.findall(r"fact: ([^\n]+)", conversation)]


def script(view: View) -> Reply | ToolCall | str:
    """The model: recalls on questions (the tea question finds the fact, any other finds nothing), answers a
    tool result, and summarizes the facts said."""
    if view.summary:
        return json.dumps(said_facts(view.user_text))
    if view.tool_result is not None:
        return "Brewing it now."
    if view.user_text.endswith("?"):
        query = "favourite tea" if "tea" in view.user_text else "quantum chromodynamics lecture"
        return ToolCall("load_memory", {"query": query})
    return "ok"


def tool_answer(tool_result: str | None) -> object:
    """The tool answer the model reads: the text itself, or (Gemini, SAP AI Core) the response object's ``result``."""
    assert tool_result is not None, "the request carries no tool result"
    try:
        value = json.loads(tool_result)
    except json.JSONDecodeError:
        return tool_result
    if isinstance(value, dict) and set(value) <= {"result", "reference"} and isinstance(value.get("result"), str):
        return tool_answer(value["result"])
    return value


@dataclass
class Wire:
    """One kagent session spoken in as the bridge would, its model behind a loopback provider."""

    http: httpx.AsyncClient
    provider: Provider
    controller: FakeController
    bridge: Bridge
    generation: int
    streaming: bool
    context: str = ""

    async def say(self, text: str, *, header: bool = True) -> str:
        scope = self.bridge.sign(time.time(), gen=self.generation) if header else None
        agent = A2AClient(self.http)
        if self.streaming:
            return await agent.stream(text, context_id=self.context, user=ALICE, scope=scope)
        return json.dumps(await agent.send(text, context_id=self.context, user=ALICE, scope=scope))

    def chats(self, since: int = 0) -> list[View]:
        return [
            request.view
            for request in self.provider.requests[since:]
            if request.kind == "chat" and request.view is not None  # a chat request always has its view
        ]

    def bodies(self, since: int = 0) -> list[bytes]:
        return [request.body for request in self.provider.requests[since:] if request.kind in ("chat", "summary")]


@pytest.fixture
async def consented(store: Store, bridge: Bridge) -> tuple[ScopeKey, int]:
    key = verify(bridge.sign(time.time()), bridge.trust(), now=now(), user_id=ALICE).key
    assert key is not None  # a scope token, not an offboarding one
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    await store.write(key, generation, facts(TEA))
    return key, generation


OpenWire = Callable[[Adapter, bool, Script], AbstractAsyncContextManager[Wire]]


@pytest.fixture
def wire(
    runtime: Runtime,
    controller: FakeController,
    bridge: Bridge,
    consented: tuple[ScopeKey, int],
    monkeypatch: pytest.MonkeyPatch,
) -> OpenWire:
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def open_wire(adapter: Adapter, streaming: bool, answer: Script) -> AsyncIterator[Wire]:
        with Provider(answer) as provider:
            adapter.apply(provider, monkeypatch)
            config = {**CONFIG, "model": adapter.model(provider), "stream": streaming}
            app = build_app(None, config=config, local=False, streaming=True)  # kagent builds the adapter
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as http:
                yield Wire(http, provider, controller, bridge, consented[1], streaming, new_context())
            await runtime.service.drain()

    return open_wire


@pytest.mark.parametrize("streaming", MODES)
@pytest.mark.parametrize("adapter", available(), ids=lambda adapter: adapter.name)
async def test_every_memory_path_reaches_the_provider_as_the_model_can_read_it(
    wire: OpenWire,
    runtime: Runtime,
    store: Store,
    consented: tuple[ScopeKey, int],
    adapter: Adapter,
    streaming: bool,
) -> None:
    async with wire(adapter, streaming, script) as session:
        answer = await session.say(QUESTION)  # a new session: prefetch, then load_memory
        prefetched, loaded = session.chats()[:2]
        assert RECALLED in prefetched.system  # prefetch: the system text of this invocation's request
        assert loaded.tool_name == "load_memory"
        found = tool_answer(loaded.tool_result)
        assert isinstance(found, dict) and [m["content"]["parts"][0]["text"] for m in found["memories"]] == [TEA]
        assert RECALLED not in answer  # the A2A answer holds the placeholder

        later = len(session.provider.requests)
        await session.say("Do you remember anything about my notes?")  # same session: no prefetch, no hits
        first, nothing = session.chats(later)[:2]
        assert session.provider.received(placeholder(1), kind="chat")  # what the earlier recall left
        assert RECALLED not in first.system and tool_answer(nothing.tool_result) == {"memories": []}

        await session.say("Is tea on the menu?", header=False)  # memory-free: the tools answer a reason code
        assert tool_answer(session.chats(later)[-1].tool_result) == "Memory unavailable: no_assertion"

        for text in ("fact: I keep bees on the roof", "fact: my sister is called Ana", "how are you"):
            await session.say(text)  # admitted turns 3 to 5: auto-save summarizes them
        await runtime.service.drain()
        [summary] = session.provider.views("summary")
        assert "I keep bees on the roof" in summary.user_text and QUESTION in summary.user_text
        assert "menu" not in summary.user_text  # said without a scope header: never collected
        assert not any(RECALLED.encode() in body for body in session.bodies(later))  # nothing recalled, later
        assert not session.controller.received(RECALLED)  # nor kept by kagent (session events, tasks)
    texts = {entry.text for entry in (await store.inspect(consented[0])).entries}
    assert texts == {TEA, "I keep bees on the roof", "my sister is called Ana"}  # the summary, as the adapter read it


def failing(view: View) -> Failure:
    """A provider failing with a body that quotes the prompt, the prefetched fact included."""
    return Failure(500, f"{SENTINEL} overloaded; prompt was: {view.system[-300:]}", midstream=view.stream)


@pytest.mark.parametrize("streaming", MODES)
@pytest.mark.parametrize("adapter", available(), ids=lambda adapter: adapter.name)
async def test_a_provider_failure_inside_memory_work_answers_model_failed_whichever_adapter_raised_it(
    wire: OpenWire, adapter: Adapter, streaming: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with wire(adapter, streaming, failing) as session:
        answer = await session.say(QUESTION)
        assert session.provider.received(RECALLED, kind="chat")  # the provider got the fact, and failed
        assert "model_failed" in answer
        assert SENTINEL not in answer and RECALLED not in answer
        assert not session.controller.received(SENTINEL) and not session.controller.received(RECALLED)
    assert SENTINEL not in caplog.text and RECALLED not in caplog.text
