"""A Kestrel process for crash tests: starts or resumes one run, and SIGKILLs itself on cue.

The kill comes from a thin subclass of the real SQLite store: right after the N-th durable
append of a given entry kind, the process sends itself SIGKILL, as a crash would.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
from pathlib import Path

from bot.domain import Decision, DecisionKind, Entry, Request
from bot.events import FanOut
from bot.llm.openai_provider import OpenAIProvider
from bot.prompters import DeferringPrompter
from bot.runs import LiveRun, ResumeRefused, Supervisor
from bot.runtime import Runtime, ToolSource
from bot.state import fold
from bot.tools.catalog import load_catalog
from bot.tools.toolset import ToolSet
from storage.sqlite import SqliteStore


class CrashingStore(SqliteStore):
    """The real store, killed right after a chosen append is durable."""

    def __init__(self, path: Path, kind: str, nth: int) -> None:
        super().__init__(path)
        self._kind, self._left = kind, nth

    def submit(self, run_id: str, seq: int, epoch: int, entry: Entry) -> asyncio.Future[None]:
        done = super().submit(run_id, seq, epoch, entry)
        if entry.kind == self._kind:
            self._left -= 1
            if self._left == 0:
                done.add_done_callback(lambda _: os.kill(os.getpid(), signal.SIGKILL))
        return done


class ApprovingPrompter:
    """Someone at the keyboard who approves every call once."""

    @property
    def present(self) -> bool:
        return True

    async def ask(self, request: Request) -> Decision | None:
        return Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="U0APPROVER")


async def resume_when_free(sup: Supervisor, run_id: str) -> LiveRun | None:
    """Resume once the crashed owner's lease has expired."""
    for _ in range(50):
        try:
            return await sup.resume(run_id, prompter=DeferringPrompter())
        except ResumeRefused:
            await asyncio.sleep(0.2)
    raise SystemExit("the crashed owner's lease never expired")


async def main(args: argparse.Namespace) -> None:
    kind, _, nth = (args.crash_after or ":0").partition(":")
    store = CrashingStore(Path(args.db), kind, int(nth or 0))
    await store.migrate()
    rt = Runtime(
        store=store,
        model=OpenAIProvider("fake-model", api_key="test-key", base_url=args.base_url),
        tools=ToolSource(ToolSet(load_catalog(args.catalog))),
        events=FanOut(),
        owner=f"child-{os.getpid()}",
        lease_seconds=0.5,
    )
    sup = Supervisor(rt)
    if args.settle:
        request_id, choice = args.settle.split("=")
        decision = Decision(request_id=request_id, kind=DecisionKind(choice), by="U0ONCALL")
        rt.policy.settings.oncall.append("U0ONCALL")
        answered = await sup.answer(decision, run_id=args.resume)
        assert answered.accepted, answered.message
    if args.resume:
        live = await resume_when_free(sup, args.resume)
    else:
        prompter = ApprovingPrompter() if args.approve else DeferringPrompter()
        live = await sup.start_turn("fix it", requested_by="U0REQ", prompter=prompter)
        Path(args.run_id_file).write_text(live.run_id)  # noqa: ASYNC240 - before any crash
    if live is not None:
        await sup.wait(live)
    run_id = args.resume or live.run_id  # type: ignore[union-attr]
    state = fold(await store.load(run_id), run_id)
    out = {
        "status": (await store.get_run(run_id)).status.value,
        "requests": [r.model_dump(mode="json") for r in state.open_requests],
        "outcomes": state.outcomes(),
    }
    print(json.dumps(out))
    await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--catalog", required=True)
    parser.add_argument("--crash-after", default="")
    parser.add_argument("--resume", default="")
    parser.add_argument("--settle", default="")
    parser.add_argument("--run-id-file", default="")
    parser.add_argument("--approve", action="store_true", help="approve every gated call inline")
    asyncio.run(main(parser.parse_args()))
