"""Drives two real `mailslot mcp` processes (alice and bob) with the Python MCP SDK (`mcp` 2.3.0),
in both protocol eras, through a relay given on the command line.

    python python_client.py --mailslot target/debug/mailslot --relay ws://127.0.0.1:PORT

Run by tests/it/interop.rs (which starts the relay); `.ci/interop-setup` installs the SDK. Prints one
line per check and exits 1 with a clear message on the first failure. Every wait has a timeout;
nothing sleeps to synchronise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import traceback
import warnings
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

import mcp_types as types
from mcp import Client, MCPDeprecationWarning, StdioServerParameters
from mcp.client.extension import ClientExtension, NotificationBinding
from mcp.client.subscriptions import ResourceUpdated
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ConfigDict

# subscribe_resource is deprecated in 2026-07-28; the legacy era is what we test with it.
warnings.simplefilter("ignore", MCPDeprecationWarning)

TIMEOUT = 20.0
INBOX = "mailslot://inbox"
CHANNEL = "notifications/claude/channel"
TOOLS = sorted(
    [
        "acknowledge",
        "contacts",
        "create_group",
        "directory",
        "forget",
        "group_members",
        "groups",
        "inbox",
        "join_group",
        "leave_group",
        "mark_read",
        "presence",
        "read",
        "recall",
        "release_files",
        "remember",
        "renew_files",
        "reply",
        "reply_all",
        "request_contact",
        "reservations",
        "reserve_files",
        "save_attachment",
        "search",
        "send",
        "sent",
        "set_status",
        "thread",
        "wait_for_mail",
        "whois",
    ]
)


class Failure(Exception):
    pass


def check(ok: bool, what: str, detail: Any = "") -> None:
    if not ok:
        raise Failure(f"{what}: {detail}" if detail != "" else what)


def passed(era: str, what: str) -> None:
    print(f"ok   [{era}] {what}", flush=True)


class Pushes:
    """Everything a server pushed to one client, with a timed wait for the first match."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.items: list[Any] = []
        self._cond = asyncio.Condition()

    async def put(self, item: Any) -> None:
        async with self._cond:
            self.items.append(item)
            self._cond.notify_all()

    async def take(self, pick: Callable[[Any], bool], what: str) -> Any:
        async def find() -> Any:
            async with self._cond:
                while True:
                    for i, item in enumerate(self.items):
                        if pick(item):
                            return self.items.pop(i)
                    await self._cond.wait()

        try:
            return await asyncio.wait_for(find(), TIMEOUT)
        except asyncio.TimeoutError:
            raise Failure(f"{self.name} got no {what} within {TIMEOUT:.0f} s; it got {self.items!r}") from None

    async def on_message(self, message: Any) -> None:
        """The SDK's message_handler: typed server notifications (and transport errors)."""
        await self.put(message)


class ChannelParams(BaseModel):
    model_config = ConfigDict(extra="allow")
    content: Any = None
    meta: Any = None


class ChannelObserver(ClientExtension):
    """The SDK drops notifications its protocol tables do not know before message_handler sees
    them; an extension's NotificationBinding is the documented way to observe a vendor one."""

    identifier = "io.github.mailslot/channel-observer"

    def __init__(self, pushes: Pushes) -> None:
        self.pushes = pushes

    def notifications(self) -> list[NotificationBinding[Any]]:
        async def record(params: ChannelParams) -> None:
            await self.pushes.put(("channel", params.model_dump()))

        return [NotificationBinding(method=CHANNEL, params_type=ChannelParams, handler=record)]


def is_updated(uri: str) -> Callable[[Any], bool]:
    return lambda m: isinstance(m, types.ResourceUpdatedNotification) and m.params.uri == uri


def is_channel(m: Any) -> bool:
    return isinstance(m, tuple) and m[0] == "channel"


async def tool(client: Client, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """Calls a tool that must succeed; its structured result (the SDK validates it against the
    tool's output schema)."""
    result = await client.call_tool(name, args)
    texts = [c.text for c in result.content if isinstance(c, types.TextContent)]
    check(not result.is_error, f"{name}({json.dumps(args)}) failed", texts)
    check(result.structured_content is not None, f"{name} returned no structured content", texts)
    return result.structured_content


async def online(client: Client, who: str) -> None:
    """The contacts tool waits for the relay connection; policy is null only when it failed."""
    view = await tool(client, "contacts", {})
    check(view.get("policy") is not None, f"{who} did not reach the relay", view.get("relay"))


async def surface(era: str, client: Client, who: str) -> None:
    tools = (await client.list_tools()).tools
    names = sorted(t.name for t in tools)
    check(names == TOOLS, "tools/list names", names)
    for t in tools:
        check(bool(t.description) and len(t.description) > 20, f"tool {t.name} has no description")
        check(t.output_schema is not None, f"tool {t.name} has no output schema")
        check(t.annotations is not None, f"tool {t.name} has no annotations")
    passed(era, f"tools/list: the {len(TOOLS)} tools, each with a description, annotations, an output schema")

    uris = {str(r.uri) for r in (await client.list_resources()).resources}
    for uri in (INBOX, "mailslot://sent", "mailslot://memory", "mailslot://identity", "mailslot://directory"):
        check(uri in uris, f"resources/list lacks {uri}", sorted(uris))
    templates = sorted(t.uri_template for t in (await client.list_resource_templates()).resource_templates)
    check(
        templates
        == [
            "mailslot://agents/{agent}",
            "mailslot://messages/{message_id}",
            "mailslot://messages/{message_id}/attachments/{index}",
            "mailslot://threads/{thread_id}",
        ],
        "resources/templates/list",
        templates,
    )
    passed(era, "resources/list: inbox, sent, memory, identity, directory; agent, message, attachment and thread templates")

    prompts = sorted(p.name for p in (await client.list_prompts()).prompts)
    check(prompts == ["reply", "startup", "triage"], "prompts/list", prompts)
    startup = await client.get_prompt("startup")
    text = startup.messages[0].content.text
    check(f"mailslot agent {who}" in text, "prompts/get startup names the agent", text[:200])
    passed(era, "prompts/list: reply, startup, triage; prompts/get startup names the agent")

    identity = await client.read_resource("mailslot://identity")
    body = json.loads(identity.contents[0].text)
    check(body.get("address") == who, "identity address", body)
    passed(era, f"resources/read mailslot://identity: address {who}")


def connected(era: str, client: Client, who: str) -> None:
    version = client.protocol_version
    if era == "legacy":
        check(version in HANDSHAKE_PROTOCOL_VERSIONS, "legacy negotiated a handshake-era version", version)
    else:
        check(version in MODERN_PROTOCOL_VERSIONS, "auto negotiated a 2026-07-28+ version", version)
    caps = client.server_capabilities
    check(caps.resources is not None and caps.resources.subscribe is True, "resources.subscribe advertised", caps)
    check(bool(caps.tools) and bool(caps.prompts), "tools and prompts advertised", caps)
    check(client.server_info is not None and client.server_info.name == "mailslot", "serverInfo", client.server_info)
    experimental = caps.experimental or {}
    check("claude/channel" in experimental, "experimental claude/channel advertised", experimental)
    passed(era, f"{who} connected: protocol {version}, serverInfo mailslot, resources.subscribe, claude/channel")


async def run_era(era: str, mailslot: str, relay: str, home: str) -> None:
    mode = "legacy" if era == "legacy" else "auto"

    def server(name: str) -> StdioServerParameters:
        # The SDK passes only a minimal safe environment (PATH, HOME, ...) plus this.
        return StdioServerParameters(
            command=mailslot,
            args=["--agent", name, "--relay", relay, "mcp"],
            env={"MAILSLOT_HOME": home, "MAILSLOT_LOG": "warn"},
        )

    async with AsyncExitStack() as stack:
        pushes = {name: Pushes(name) for name in ("alice", "bob")}
        clients: dict[str, Client] = {}
        for name in ("bob", "alice"):
            clients[name] = await stack.enter_async_context(
                Client(
                    server(name),
                    mode=mode,
                    message_handler=pushes[name].on_message,
                    extensions=[ChannelObserver(pushes[name])],
                    read_timeout_seconds=TIMEOUT,
                )
            )
            connected(era, clients[name], name)
        alice, bob = clients["alice"], clients["bob"]

        await surface(era, bob, "bob")

        # Both must be registered at the relay before mail can be addressed to them.
        await online(bob, "bob")
        await online(alice, "alice")
        passed(era, "alice and bob are connected to the relay")

        listens: dict[str, Any] = {}
        for name, client in clients.items():
            if era == "legacy":
                await client.subscribe_resource(INBOX)
            else:
                sub = await stack.enter_async_context(
                    client.listen(resource_subscriptions=[INBOX], resources_list_changed=True)
                )
                honored = sub.honored.resource_subscriptions or []
                check(INBOX in honored, f"{name}'s listen acknowledged {INBOX}", sub.honored)
                listens[name] = sub
        how = "resources/subscribe" if era == "legacy" else "subscriptions/listen (acknowledged)"
        passed(era, f"alice and bob subscribed to {INBOX} with {how}")

        subject = f"interop {era}"
        body = f"Hello bob, this is the {era} era from Python."
        sent = await tool(alice, "send", {"to": ["bob"], "subject": subject, "body": body})
        check(sent.get("status") == "sent", "send status", sent)
        passed(era, f"alice send -> bob: status sent, message_id {sent['message_id']}")

        async def updated(name: str) -> None:
            if era == "legacy":
                await pushes[name].take(is_updated(INBOX), f"notifications/resources/updated for {INBOX}")
            else:
                sub = listens[name]

                async def next_update() -> None:
                    while True:
                        event = await anext(sub)
                        if isinstance(event, ResourceUpdated) and event.uri == INBOX:
                            return

                try:
                    await asyncio.wait_for(next_update(), TIMEOUT)
                except asyncio.TimeoutError:
                    raise Failure(f"{name}'s listen stream got no ResourceUpdated({INBOX}) within {TIMEOUT:.0f} s")
                except StopAsyncIteration:
                    raise Failure(f"{name}'s listen stream ended before ResourceUpdated({INBOX})") from None

        await updated("bob")
        passed(era, f"bob received notifications/resources/updated for {INBOX}")

        if era == "legacy":
            _, event = await pushes["bob"].take(is_channel, CHANNEL)
            content, meta = event.get("content"), event.get("meta")
            check(isinstance(content, str), "channel params.content is a string", event)
            for part in ("From: alice", "Signature: verified", body, "<<<mailslot-untrusted "):
                check(part in content, f"channel content contains {part!r}", content)
            check(isinstance(meta, dict), "channel params.meta is an object", event)
            check(all(isinstance(v, str) for v in meta.values()), "channel meta values are strings", meta)
            expected = {
                "from": "alice",
                "message_id": sent["message_id"],
                "thread_id": sent["thread_id"],
                "trust": "verified",
            }
            for key, value in expected.items():
                check(meta.get(key) == value, f"channel meta.{key}", meta)
            passed(era, f"bob received {CHANNEL}: framed message, string meta from/message_id/thread_id/trust")

        read = await tool(bob, "read", {"message_id": sent["message_id"]})
        framed = read.get("framed", "")
        check(body in framed and "From: alice" in framed, "read returns the framed message", framed)
        check(read.get("message_id") == sent["message_id"], "read message_id", read)
        passed(era, "bob read: the framed message from alice")

        reply_body = f"Hi alice, got your {era} message."
        reply = await tool(bob, "reply", {"message_id": sent["message_id"], "body": reply_body})
        check(reply.get("status") == "sent", "reply status", reply)
        check(reply.get("thread_id") == sent["thread_id"], "reply stays in the thread", reply)
        passed(era, "bob reply: status sent, same thread")

        await updated("alice")
        if era == "legacy":
            _, event = await pushes["alice"].take(
                lambda m: is_channel(m) and m[1].get("meta", {}).get("from") == "bob", f"{CHANNEL} from bob"
            )
            check(f"Subject: Re: {subject}" in event["content"], "the reply's channel content", event["content"])
        got = await tool(alice, "read", {"message_id": reply["message_id"]})
        check(reply_body in got.get("framed", ""), "alice reads the reply", got)
        check(got.get("thread_id") == sent["thread_id"], "the reply's thread", got)
        what = "resources/updated and the channel event" if era == "legacy" else "resources/updated"
        passed(era, f"alice received the reply ({what}) and read it")

        bad = await alice.call_tool("read", {"message_id": "42"})
        texts = " ".join(c.text for c in bad.content if isinstance(c, types.TextContent))
        check(bad.is_error is True, "read 42 is a tool error (isError)", texts)
        check("message_id" in texts, "the error names the argument", texts)
        passed(era, "read with message_id 42: isError result naming message_id")

        if era != "legacy":
            channel = [m for p in pushes.values() for m in p.items if is_channel(m)]
            print(f"info [{era}] channel events seen on modern sessions: {len(channel)}", flush=True)


def find_failure(error: BaseException) -> Failure | None:
    """Our Failure, also when the SDK's task groups wrapped it in exception groups."""
    if isinstance(error, Failure):
        return error
    for inner in getattr(error, "exceptions", ()):
        if (found := find_failure(inner)) is not None:
            return found
    return None


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mailslot", required=True, help="the mailslot binary")
    parser.add_argument("--relay", required=True, help="the relay URL, e.g. ws://127.0.0.1:7878")
    parser.add_argument("--era", choices=["legacy", "modern", "both"], default="both")
    args = parser.parse_args()
    eras = ["legacy", "modern"] if args.era == "both" else [args.era]
    with tempfile.TemporaryDirectory(prefix="mailslot-interop-") as home:
        for era in eras:
            try:
                await run_era(era, args.mailslot, args.relay, home)
            except BaseException as error:
                failure = find_failure(error)
                if failure is not None:
                    print(f"FAIL [{era}] {failure}", file=sys.stderr, flush=True)
                else:
                    print(f"FAIL [{era}] unexpected error:", file=sys.stderr, flush=True)
                    traceback.print_exc()
                return 1
    print(f"python mcp SDK interop: all checks passed ({', '.join(eras)})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
