"""``runner chat``: a terminal conversation with a conversational run on the workers."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from . import refs, sources
from ._app import commands
from ._session import BadUsage, session

app = commands()
"""This module's commands, loaded by the ``runner`` group when one is called."""


@app.command()
def chat(
    ctx: typer.Context,
    run: Annotated[
        str | None,
        typer.Argument(metavar="[RUN]", help="The conversation's run id (or a unique prefix)."),
    ] = None,
    flow: Annotated[
        str | None,
        typer.Option(
            "--flow",
            metavar="FLOW",
            help="Start a new conversation: a run of this conversational flow (pkg.mod:Class).",
        ),
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout", min=0, metavar="SECONDS", help="Give up waiting for a reply after this."
        ),
    ] = None,
) -> None:
    """Talk with a conversational run, a turn per line.

    Each line you type is a turn (a new epoch of the run on the workers, its history in the
    run); the reply is printed. `exit` or `quit` (any case), end of input or Ctrl-C ends the
    chat; the run stays, to go on later with `runner chat RUN`. With --flow, the first line
    starts a new run of that flow.
    """
    from runner.distributed import client
    from runner.flow import conversation
    from runner.flow.loading import load_flow

    if (run is None) == (flow is None):
        raise BadUsage("give a RUN to go on with, or --flow to start a new conversation")
    rt = session(ctx).rt
    if flow is not None:
        flow_cls = sources.flow_class(flow)
        conversation.refuse_unless_conversational(flow_cls, "runner chat --flow")
        client.check_importable(flow_cls)
        client.check_allowed(flow_cls, rt)
        handle: Any = None

        def take_turn(text: str) -> Any:
            nonlocal handle
            if handle is None:
                handle = client.submit(flow_cls, {conversation.USER_MESSAGE: text}, rt=rt)
                typer.echo(f"run {handle.run_id}", err=True)
                return handle.result(timeout)
            return handle.turn(text, timeout)

    else:
        handle = client.RunHandle(refs.resolve_run(rt, run or ""), rt)
        # A run of a flow that is not conversational is refused before the first line.
        conversation.refuse_unless_conversational(
            load_flow(str(handle.latest().flow)), f"runner chat {handle.run_id}"
        )

        def take_turn(text: str) -> Any:
            return handle.turn(text, timeout)

    conversation.chat_loop(take_turn, prompt="You: ", assistant_prefix="Assistant: ")
