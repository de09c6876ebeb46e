"""The ``runner`` command group: global options and the one place errors become exit codes."""

import importlib
from typing import Annotated, Any, Final

import typer
import typer.main
from typer.core import TyperGroup

from runner.errors import RunnerError

from ._session import FAILED, FLAG, USAGE, Session, exit_code_for, report, session, usage_line

HELP = """Submit, follow, inspect, resume and fork durable flow runs.

The Redis URL (required) comes from RUNNER_REDIS_URL or --redis-url, the key prefix from RUNNER_PREFIX and the Celery queue from RUNNER_QUEUE, as for the workers.

Exit codes: 0 ok (a waited-for run succeeded or paused); 1 a run failed or was cancelled, an operation was refused or timed out, or Redis is unreachable; 2 bad input (malformed option or Redis URL; unknown run, checkpoint, flow or step; a flow outside the workers' allow-list; invalid inputs).
"""  # noqa: E501  (one line a paragraph: the help formatter wraps it)


# Typer >= 0.20 vendors click (``typer._click``); older releases use click itself. Its usage
# error class is found through the public ``typer.BadParameter``, whichever it is.
UsageError: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError"
)
ClickException: type[Exception] = next(
    c for c in UsageError.__mro__ if c.__name__ == "ClickException"
)
# A closed pipe (``runner runs | head``) is typer's to handle, as click does: exit 1 quietly.
PASS_THROUGH: tuple[type[BaseException], ...] = (
    typer.Exit,
    typer.Abort,
    ClickException,
    BrokenPipeError,
)


def _shows_help(exc: Exception) -> bool:
    # ``runner`` alone prints the help (click's NoArgsIsHelpError, a usage error subclass).
    return type(exc).__name__ == "NoArgsIsHelpError"


MARKUP: Final = "markdown"
"""How help texts are rendered, the group's and every command's alike."""

COMMANDS: dict[str, str] = {
    **dict.fromkeys(["submit", "status", "watch", "runs", "cancel"], "runs"),
    **dict.fromkeys(["resume", "fork", "recover", "prune", "upgrade"], "ops"),
    **dict.fromkeys(["checkpoints", "steps", "show", "diff", "graph"], "history"),
    **dict.fromkeys(["pin", "unpin", "gc", "restore"], "retain"),
    "chat": "chat",
    "worker": "worker",
    "workers": "fleet",
    "dev": "dev",
    "ui": "ui",
    "limits": "limits",
    "check-deploy": "deploy",
    "schedule": "schedules",
    **dict.fromkeys(["rekey", "store"], "storage"),
}
"""Each command's module under :mod:`runner.cli`, in the order ``--help`` lists them. A module
is imported when one of its commands is called or listed, so ``runner runs`` imports neither
the others nor what they import (the runtime, the flow core)."""


def commands() -> typer.Typer:
    """The Typer a command module registers its commands on (``app = commands()``); the
    group loads it by name through :data:`COMMANDS`."""
    return typer.Typer(
        add_completion=False, rich_markup_mode=MARKUP, pretty_exceptions_enable=False
    )


class RunnerGroup(TyperGroup):
    """Loads each command's module on first use; turns every error into one ``error:`` line
    on stderr and its exit code."""

    def list_commands(self, ctx: Any) -> list[str]:
        """Every command, in :data:`COMMANDS` order, without importing their modules."""
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        """The command named ``cmd_name``, its module imported and converted on first use.
        An unknown name loads them all, so the error can suggest the closest one."""
        for name in [cmd_name] if cmd_name in COMMANDS else COMMANDS:
            if name not in self.commands:
                self._load(COMMANDS[name], name)
        return self.commands.get(cmd_name)

    def _load(self, module: str, name: str) -> None:
        # typer's public conversion of a Typer to click: a group of the module's commands,
        # or the command itself when the module has one. Of a module of plain commands,
        # only the one called is converted (the conversion reads every parameter of each).
        source = importlib.import_module(f"{__package__}.{module}").app
        wanted = [info for info in source.registered_commands if _name(info) == name]
        if wanted and not (source.registered_groups or source.registered_callback):
            source = commands()
            source.registered_commands = wanted
        found = typer.main.get_command(source)
        named = found.commands if isinstance(found, TyperGroup) else {found.name: found}
        for each, command in named.items():
            self.add_command(command, each)

    def make_context(
        self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any
    ) -> Any:
        """Parse the global options; a usage error is one line and exit code 2."""
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except UsageError as exc:
            if _shows_help(exc):
                raise
            typer.echo(usage_line(exc), err=True)
            raise typer.Exit(USAGE) from None

    def invoke(self, ctx: Any) -> Any:
        """Run the command; map runner errors to exit codes (``--debug``: with tracebacks)."""
        try:
            return super().invoke(ctx)
        except UsageError as exc:
            if _shows_help(exc):
                raise
            typer.echo(usage_line(exc), err=True)
            raise typer.Exit(USAGE) from None
        except PASS_THROUGH:
            raise
        except RunnerError as exc:
            report(exc, debug=_debug(ctx))
            raise typer.Exit(exit_code_for(exc)) from None
        except Exception as exc:
            report(exc, debug=_debug(ctx), internal=True)
            raise typer.Exit(FAILED) from None


def _name(info: Any) -> str | None:
    """The name typer gives the command of ``info`` (a ``typer.models.CommandInfo``)."""
    if info.name:
        return str(info.name)
    return typer.main.get_command_name(info.callback.__name__) if info.callback else None


def _debug(ctx: Any) -> bool:
    obj = ctx.find_object(Session)
    return bool(obj and obj.debug)


app = typer.Typer(
    cls=RunnerGroup,
    name="runner",
    help=HELP,
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=MARKUP,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _global(
    ctx: typer.Context,
    redis_url: Annotated[
        str | None,
        typer.Option(
            "--redis-url",
            metavar="URL",
            help="Redis of the runs (default: RUNNER_REDIS_URL).",
            show_default=False,
        ),
    ] = None,
    debug: Annotated[
        bool, typer.Option("--debug", help="Show tracebacks of errors.", metavar=FLAG)
    ] = False,
) -> None:
    """Global options: they go before the command (``runner --debug status RUN``)."""
    ctx.obj = Session(redis_url=redis_url, debug=debug)
    ctx.call_on_close(session(ctx).close)
