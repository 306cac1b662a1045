"""Where an option given before its command goes: the hint a usage error adds, at every level of
``kestrel`` (``kestrel --json runs list``, ``kestrel runs --as bob approve …``)."""

from __future__ import annotations

from typing import Any

import click


class PlacingGroup(click.Group):
    """A group of commands whose usage error, for an option one of its commands has but that was
    given before that command, says where the option goes."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        try:
            # A copy: click's parser consumes the list it reads, which the hint below reads.
            return super().make_context(info_name, list(args), parent, **extra)
        except click.NoSuchOption as exc:
            raise _command_option_placed(exc, self, args) from None

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        # ``kestrel help`` was answered "Did you mean 'health'?": a command of other tools
        # (git, go) is an option here.
        word = args[0] if args else ""
        option = _AS_OPTIONS.get(word)
        if option is not None and self.get_command(ctx, word) is None and option in _options(ctx):
            ctx.fail(f"No such command '{word}': it is an option here, {ctx.command_path} {option}")
        return super().resolve_command(ctx, args)


# Commands of other tools that are options here.
_AS_OPTIONS = {"help": "--help", "version": "--version"}


def _options(ctx: click.Context) -> set[str]:
    """The options ``ctx``'s command takes, ``--help`` among them."""
    return {name for param in ctx.command.get_params(ctx) for name in param.opts}


def _command_option_placed(
    exc: click.NoSuchOption, group: click.Group, args: list[str]
) -> click.NoSuchOption:
    """``exc``, saying where an option of the command named in ``args`` goes when it was given
    before the command (``kestrel --json runs list``), instead of suggesting one of the group's
    own (``--version``)."""
    path, command = _named_command(group, args)
    found = [p for p in command.params if path and exc.option_name in p.opts]
    option = found[0] if found else None
    if not isinstance(option, click.Option) or exc.ctx is None:
        return exc
    takes = "" if option.is_flag else f" {option.metavar or (option.name or '').upper()}"
    named = f"{exc.ctx.command_path} {path}"
    message = (
        f"{exc.message} It is an option of {named}: give it after the command,"
        f" {named} {exc.option_name}{takes} …"
    )
    return click.NoSuchOption(exc.option_name, message, None, exc.ctx)


def _named_command(group: click.Group, args: list[str]) -> tuple[str, click.Command]:
    """The command ``args`` name below ``group`` (its path, "" for none): from the first word
    that names one (the words before it are options' values), down to the first that does not."""
    path: list[str] = []
    command: click.Command = group
    for token in args:
        if token.startswith("-"):
            continue
        below = command if isinstance(command, click.Group) else None
        found = below.get_command(click.Context(below), token) if below else None
        if found is None and path:
            break
        if found is not None:
            path.append(token)
            command = found
    return " ".join(path), command
