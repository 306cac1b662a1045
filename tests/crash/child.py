"""A Kestrel process for crash tests: starts, resumes or adopts one run, SIGKILLed on cue.

The kill comes from a thin subclass of the real store (SQLite, or PostgreSQL when ``--db`` is
a DSN): right after the N-th durable append of a given entry kind, the process sends itself
SIGKILL, as a crash would.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib
import json
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import msgspec

from bot import wire
from bot.chat.service import ChatService
from bot.config.settings import McpServerSettings
from bot.domain import Decision, DecisionKind, Request
from bot.errors import ResumeRefused
from bot.events import Event, FanOut, RequestOpenedEvent, ToolStartedEvent
from bot.hooks import Hooks, load_hook
from bot.journal.fold import fold
from bot.kinds import RequestKind
from bot.llm.openai_provider import OpenAIProvider
from bot.people.policy import Actor
from bot.prompter import DeferringPrompter, Prompter
from bot.run.runtime import Runtime
from bot.run.supervisor import LiveRun, Supervisor
from bot.tools.ask_human import ask_human_tools
from bot.tools.base import Tool
from bot.tools.catalog import load_catalog
from bot.tools.isolation import Isolation
from bot.tools.mcp import McpSource, McpTools
from bot.tools.propose_plan import propose_plan_tool
from bot.tools.python import function_tool
from bot.tools.source import ToolSource
from bot.tools.standby import Standby
from bot.tools.toolset import ToolSet
from storage.sql_store import SqlStore
from tests.crash.crashing import crashing_store

MCP_SERVER = Path(__file__).resolve().parents[1] / "fakes" / "mcp_server.py"


class Named(msgspec.Struct, frozen=True):
    """The arguments of ``record``: a name, as the catalog's commands take."""

    name: str


@function_tool(idempotent=False)
async def record(args: Named) -> str:
    """Record a side effect in the process (an in-process tool, not idempotent)."""
    await asyncio.sleep(0.05)  # an effect that takes a moment, as a command's does
    with open(os.environ["EFFECTS_FILE"], "a") as effects:  # noqa: ASYNC230 - one short line
        effects.write(f"{args.name}\n")
    return f"recorded {args.name}"


def tools(catalog: str, isolation: Isolation) -> list[Tool]:
    """Every kind of tool a run may reach execution through: catalog commands, an in-process
    function, the questions to people and ``propose_plan`` (and, with ``--mcp``, an MCP
    server's: ``mcp_tools``)."""
    return [*load_catalog(catalog, isolation), record, *ask_human_tools(), propose_plan_tool()]


def mcp_tools(builtin: list[Tool]) -> McpTools:
    """``builtin`` and the fake MCP server's tools (``srv__record`` records an effect)."""
    server = McpServerSettings(
        name="srv",
        transport="stdio",
        command=[sys.executable, str(MCP_SERVER), "--effects"],
        env={"EFFECTS_FILE": os.environ["EFFECTS_FILE"]},
        timeout=15,
    )
    return McpTools(builtin, [McpSource(server)])


class ApprovingPrompter:
    """Someone at the keyboard who approves every call once."""

    @property
    def present(self) -> bool:
        return True

    async def ask(self, request: Request) -> Decision | None:
        return Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="U0APPROVER")


async def resume_when_free(
    sup: Supervisor,
    run_id: str,
    claimed: int | None = None,
    force: bool = False,
    prompter: Prompter | None = None,
) -> LiveRun | None:
    """Resume (with the lease a decision took, if it did) once the crashed owner's has expired;
    ``prompter``: someone at the console, offered what the run waits on (else nobody is)."""
    for _ in range(50):
        try:
            return await sup.resume(
                run_id, prompter=prompter or DeferringPrompter(), claimed=claimed, force=force
            )
        except ResumeRefused as exc:
            if "--force" in str(exc):
                raise  # refused for good: the configuration changed since the run started
            await asyncio.sleep(0.1)
    raise SystemExit("the crashed owner's lease never expired")


async def adopt_when_free(sup: Supervisor, run_id: str) -> LiveRun | None:
    """Adopt the run as a ``serve`` replica does, once the dead owner's lease has expired."""
    for _ in range(50):
        if run_id in await sup.adopt_orphans():
            return sup.live.get(run_id)
        await asyncio.sleep(0.1)
    raise SystemExit("the run was never adopted")


class ApprovesWhileLive:
    """Someone who clicks Approve on each approval card as it appears, while the batch that
    opened it still runs (the decision finds the run live; its task goes on once it suspends).
    Other cards (a question, an uncertain effect) stay open for the test to see."""

    def __init__(self, chat: ChatService) -> None:
        self.chat = chat
        self.deciding: list[asyncio.Task[LiveRun | None]] = []

    def emit(self, event: Event) -> None:
        """Approve the request the card shows."""
        if (
            isinstance(event, RequestOpenedEvent)
            and event.request.kind is RequestKind.WAIT_APPROVAL
        ):
            self.deciding.append(asyncio.ensure_future(self._approve(event)))

    async def _approve(self, event: RequestOpenedEvent) -> LiveRun | None:
        decided = await self.chat.decide(
            event.run_id, event.request.id, DecisionKind.APPROVE, user=Actor("U0APPROVER")
        )
        assert decided.accepted, decided.message
        return decided.resumed


class CancelsWhileLive:
    """On-call, who cancels the run in this process as tool ``tool`` starts (a cancel of a
    live run, taken by the process that drives it: `/kestrel cancel` in its thread)."""

    def __init__(self, sup: Supervisor, tool: str) -> None:
        self.sup, self.tool = sup, tool
        self.said: list[asyncio.Task[str]] = []

    def emit(self, event: Event) -> None:
        """Cancel the run whose tool ``tool`` started."""
        if isinstance(event, ToolStartedEvent) and event.tool == self.tool:
            self.said.append(asyncio.ensure_future(self.sup.cancel(event.run_id, by="U0ONCALL")))


class StopsWhileRunning:
    """A replica told to stop (SIGTERM to ``kestrel serve``) as tool ``tool`` starts: it hands
    its runs back, letting a tool under way finish for ``grace`` seconds (none: it is killed)."""

    def __init__(self, sup: Supervisor, tool: str, grace: float) -> None:
        self.sup, self.tool, self.grace = sup, tool, grace
        self.stopping: list[asyncio.Task[list[str]]] = []

    def emit(self, event: Event) -> None:
        """Stop the process the first time tool ``tool`` starts."""
        if isinstance(event, ToolStartedEvent) and event.tool == self.tool and not self.stopping:
            stop = self.sup.shutdown(self.grace, hand_back=True)
            self.stopping.append(asyncio.ensure_future(stop))


async def clicks_done(sup: Supervisor, clicker: ApprovesWhileLive) -> None:
    """Every click's decision awaited (its failure raised), and the runs they resumed ended:
    a resumed run may open a card that brings another click, so until none is new."""
    awaited = 0
    while awaited < len(clicker.deciding):
        clicks = clicker.deciding[awaited:]
        awaited = len(clicker.deciding)
        for resumed in await asyncio.gather(*clicks):
            if resumed is not None:  # the click came after the suspend: it resumed the run
                await sup.wait(resumed)


async def closed(store: SqlStore, servers: McpTools | None, standby: Standby) -> None:
    """Close the store, the MCP servers, if any, and the helper standing by, if not taken."""
    if servers is not None:
        await servers.close()
    await standby.close()
    await store.close()


async def main(args: argparse.Namespace) -> None:
    """Start, resume, settle or cancel as ``args`` say; print where the run is."""
    kind, _, nth = (args.crash_after or ":0").partition(":")
    store = crashing_store(args.db, args.schema)
    store.crash_after(kind, int(nth or 0))
    await store.migrate()
    # A decision then a resume is ``kestrel runs approve``: the first command's helper stands
    # by from the start, as there (bot.tools.standby).
    standby = Standby(Isolation())
    if args.settle:
        await standby.start()
    builtin = tools(args.catalog, Isolation(standby=standby))
    servers = mcp_tools(builtin) if args.mcp else None
    tool_source = await servers.start() if servers else ToolSource(ToolSet(builtin))
    rt = Runtime(
        store=store,
        model=OpenAIProvider("fake-model", api_key="test-key", base_url=args.base_url),
        tools=tool_source,
        events=FanOut(),
        owner=f"child-{os.getpid()}",
        lease_seconds=0.3,
        hooks=Hooks(pre_tool_use=[load_hook(ref) for ref in args.pre_tool_use]),  # type: ignore[misc]
    )
    sup = Supervisor(rt)
    rt.policy.settings.oncall.append("U0ONCALL")
    clicker = ApprovesWhileLive(ChatService(sup))
    if args.approve_while_live:
        rt.events.add(clicker)
    if args.cancel_while_running:
        rt.events.add(CancelsWhileLive(sup, args.cancel_while_running))
    stopper = StopsWhileRunning(sup, args.stop_while_running, args.stop_grace)
    if args.stop_while_running:
        rt.events.add(stopper)
    claimed = None
    for settle in args.settle:
        request_id, _, choice = settle.partition("=")
        kind, _, text = choice.partition(":")
        decision = Decision(request_id=request_id, kind=DecisionKind(kind), text=text, by=args.by)
        answered = await sup.answer(decision, run_id=args.resume)
        if not answered.accepted:  # said, for the test to judge; nothing is resumed
            print(json.dumps({"refused": answered.message}))
            await closed(store, servers, standby)
            return
        claimed = answered.claimed  # as ChatService.decide resumes
    for request_id in args.expire:
        request, _status, _winner = await store.get_request(request_id)
        # Its deadline passed, as a replica's sweep finds it (``Supervisor.expire``).
        expired = await sup.decisions.expire(request)
        claimed = expired.epoch if expired.won else claimed
    if args.cancel:
        print(json.dumps({"cancel": await sup.cancel(args.cancel, by="U0ONCALL")}))
        await closed(store, servers, standby)
        return
    if args.resume and args.adopt:
        live = await adopt_when_free(sup, args.resume)
    elif args.resume:
        try:
            at_console = ApprovingPrompter() if args.approve else None
            live = await resume_when_free(sup, args.resume, claimed, args.force, at_console)
        except ResumeRefused as exc:  # said, for the test to judge; the decision stands
            print(json.dumps({"refused": str(exc)}))
            await closed(store, servers, standby)
            return
    else:
        prompter = ApprovingPrompter() if args.approve else DeferringPrompter()
        live = await sup.start_turn("fix it", requested_by="U0REQ", prompter=prompter)
        Path(args.run_id_file).write_text(live.run_id)  # noqa: ASYNC240 - before any crash
    if live is not None:
        await sup.wait(live)
    await clicks_done(sup, clicker)
    for stopping in stopper.stopping:
        await stopping
    run_id = args.resume or live.run_id  # type: ignore[union-attr]
    state = fold(await store.load(run_id), run_id)
    out = {
        "status": (await store.get_run(run_id)).status.value,
        "requests": [wire.to_plain(r) for r in state.open_requests],
        "outcomes": state.outcomes(),
    }
    print(json.dumps(out))
    await closed(store, servers, standby)


def parser() -> argparse.ArgumentParser:
    """The child's options."""
    options = argparse.ArgumentParser()
    options.add_argument("--db", required=True, help="a SQLite file, or a PostgreSQL DSN")
    options.add_argument("--schema", default="public", help="the PostgreSQL schema")
    options.add_argument("--base-url", required=True)
    options.add_argument("--catalog", required=True)
    options.add_argument("--crash-after", default="")
    options.add_argument("--resume", default="")
    options.add_argument("--settle", action="append", default=[], help="REQ=decision kind[:text]")
    options.add_argument("--by", default="U0ONCALL", help="who makes the --settle decisions")
    options.add_argument("--expire", action="append", default=[], help="expire REQ as overdue")
    options.add_argument("--force", action="store_true", help="resume past a changed config")
    options.add_argument("--mcp", action="store_true", help="add the fake MCP server's tools")
    options.add_argument("--adopt", action="store_true", help="take the run over as serve does")
    options.add_argument("--cancel", default="", help="cancel this run as on-call")
    options.add_argument("--run-id-file", default="")
    options.add_argument("--approve", action="store_true", help="approve every gated call inline")
    options.add_argument(
        "--pre-tool-use", action="append", default=[], help="a PreToolUse hook, module:function"
    )
    options.add_argument(
        "--approve-while-live", action="store_true", help="click Approve on each card at once"
    )
    options.add_argument(
        "--cancel-while-running", default="", help="cancel the run as on-call as TOOL starts"
    )
    options.add_argument(
        "--stop-while-running", default="", help="hand the run back as TOOL starts, as serve"
    )
    options.add_argument("--stop-grace", type=float, default=0.0, help="for a tool under way")
    return options


# What a child imports on first use and nothing here does: the catalog's checks (RE2,
# jsonschema) and what the openai client reaches on its first request. Imported once before
# the first fork, they are a fork's copy, not every child's import (0.2 to 0.4 s a child,
# several children a test).
_FIRST_USE = (
    "re2",
    "jsonschema",
    "jsonschema.validators",
    "jsonschema.protocols",
    "jiter",
    "anyio._backends._asyncio",
    "openai.resources.chat.completions.completions",
)


@functools.cache
def preload() -> None:
    """Import in this process what every child would import for itself: the modules above,
    and the openai client's HTTP transport and resources (a client made and dropped)."""
    for name in _FIRST_USE:
        importlib.import_module(name)
    OpenAIProvider("fake-model", api_key="test-key", base_url="http://127.0.0.1:9/v1")


def run_child(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run the child in a real process forked from this one (its imports already done, so a
    child costs milliseconds, not an interpreter start); its stdout and stderr come back as
    text (stderr through a file: a pipe read after stdout's could fill and stall the child)."""
    args = parser().parse_args(argv)
    preload()
    read_end, write_end = os.pipe()
    with tempfile.TemporaryFile("w+") as errors:
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            sys.stdout = os.fdopen(write_end, "w")  # not pytest's capture, which the fork copied
            os.dup2(errors.fileno(), 2)
            sys.stderr = errors
            os.environ.update(env)
            code = 0
            try:
                asyncio.run(main(args))
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        os.close(write_end)
        with os.fdopen(read_end) as output:
            out = output.read()
        _, status = os.waitpid(pid, 0)
        errors.seek(0)
        return subprocess.CompletedProcess(argv, _exit_code(status), out, errors.read())


def _exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)
