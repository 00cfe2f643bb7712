"""Pure functions over conversation text: what auto-save may summarize, what prefetch may search,
and which summarizer output may become facts. No I/O, no model calls.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from google.adk.events import Event
from google.adk.models.llm_request import LlmRequest
from google.genai import types
from kagent.adk.tools.prefetch_memory_tool import _split_sentences

from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.policy import Policy, admit_fact

SUMMARY_MARKER = "Facts (JSON list of strings):"


def clip_utf8(text: str, max_bytes: int, *, keep_end: bool = False) -> str:
    """At most ``max_bytes`` UTF-8 bytes of ``text``, cut at a character boundary (the tail if ``keep_end``)."""
    raw = text.encode("utf-8", errors="ignore")
    if len(raw) <= max_bytes:
        return raw.decode("utf-8")
    cut = raw[-max_bytes:] if keep_end else raw[:max_bytes]
    return cut.decode("utf-8", errors="ignore")


def conversation_tail(events: Iterable[Event], max_bytes: int, turns: Mapping[str, bool]) -> str:
    """The last ``max_bytes`` of the user and agent text of the collected ``turns`` (invocation id ->
    whether that turn recalled memory) and of nothing else (R36). Tool calls and tool results are left
    out: they hold recalled memories and third-party data. So is the agent's text in a turn that recalled
    memory, which may restate a recalled fact: collecting it again would extend that fact's life."""
    lines = []
    for event in events:
        if event.invocation_id not in turns or event.author == "system":
            continue
        if event.author != "user" and turns[event.invocation_id]:
            continue
        if not event.content or not event.content.parts:
            continue
        text = " ".join(part.text for part in event.content.parts if part.text and not part.thought)
        if text.strip():
            lines.append(f"{'user' if event.author == 'user' else 'assistant'}: {text.strip()}")
    return clip_utf8("\n".join(lines), max_bytes, keep_end=True)


def subqueries(message: str, policy: Policy) -> list[str]:
    """Prefetch queries for a first message: its sentences (upstream's split), at most
    ``prefetch_max_subqueries`` of them, each at most ``prefetch_max_query_bytes`` (R22)."""
    sentences = _split_sentences(message) or ([message.strip()] if message.strip() else [])
    clipped = [clip_utf8(sentence, policy.prefetch_max_query_bytes) for sentence in sentences]
    return list(dict.fromkeys(q for q in clipped if q.strip()))[: policy.prefetch_max_subqueries]


def summary_request(conversation: str, policy: Policy, model: str) -> LlmRequest:
    """Ask the agent's own ``model`` for at most ``autosave_max_facts`` durable facts as a JSON list (some
    adapters, google-adk's Gemini among them, send the request's model name and not their own)."""
    prompt = (
        "From the conversation below, extract durable facts about the user that would help in future "
        f"conversations: preferences, circumstances, decisions. At most {policy.autosave_max_facts} facts, "
        f"each one short sentence under {policy.max_fact_bytes} bytes. Answer with a JSON list of strings "
        "and nothing else; answer [] if there is nothing worth keeping.\n\n"
        f"Conversation:\n{conversation}\n\n{SUMMARY_MARKER}"
    )
    return LlmRequest(model=model, contents=[types.Content(role="user", parts=[types.Part(text=prompt)])])


def facts_from_summary(output: str, policy: Policy) -> tuple[list[str], int]:
    """The facts a summary yields and how many were dropped as ``fact_too_large`` or unstorable.

    Output that is not a JSON list of strings (code fences allowed) is ``malformed_summary``: it is
    dropped whole, never stored, never logged. At most ``autosave_max_facts`` facts are kept (R24).
    """
    text = output.strip()
    if text.startswith("```"):
        text = text.split("\n", 1)[1] if "\n" in text else ""
        text = text.rsplit("```", 1)[0]
    try:
        items = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise GovernedMemoryError(Reason.MALFORMED_SUMMARY) from None
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise GovernedMemoryError(Reason.MALFORMED_SUMMARY)
    kept, dropped = [], 0
    for item in dict.fromkeys(item.strip() for item in items):
        if not item:
            continue
        try:
            kept.append(admit_fact(item, policy))
        except GovernedMemoryError:
            dropped += 1
    return kept[: policy.autosave_max_facts], dropped
