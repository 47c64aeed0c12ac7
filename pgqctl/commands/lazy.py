"""Commands imported when they are used, not when `pgqctl` starts.

A command's module brings in what the command needs (psycopg, the library,
rich...), which takes far longer to load than `pgqctl --help` takes to
print. The group knows each command by name, where it is defined and the
first paragraph of its help, so that listing them loads none, and
`pgqctl stats` (or `pgqctl stats --help`) loads `stats` alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any, NamedTuple

import click

from pgqctl.commands.options import OnceGroup


class Lazy(NamedTuple):
    """Where a command is defined, and what `pgqctl --help` says of it."""

    target: str  # "module:attribute"
    summary: str  # see `summary_of`


def summary_of(command: click.Command) -> str:
    """What a command's line in its group's help is made from (its
    short_help, else the first paragraph of its help), on one line."""
    text = command.short_help or (command.help or "").partition("\n\n")[0]
    return " ".join(text.split())


class LazyCommands(MutableMapping[str, click.Command]):
    """A group's commands by name. Each is imported the first time it is
    looked up, and handed to `prepare` then, once; iterating gives the
    names without importing any."""

    def __init__(self, lazy: Mapping[str, Lazy], prepare: Callable[[click.Command], None]) -> None:
        self.lazy = dict(lazy)
        self._prepare = prepare
        self._loaded: dict[str, click.Command] = {}

    def loaded(self, name: str) -> click.Command | None:
        """The command `name` if it is imported already, else None."""
        return self._loaded.get(name)

    def __getitem__(self, name: str) -> click.Command:
        command = self._loaded.get(name)
        if command is None:
            target = self.lazy[name].target
            module, _, attribute = target.partition(":")
            # __import__ rather than importlib.import_module: `python -X
            # importtime` reports the imports of the one, not of the other.
            command = getattr(__import__(module, fromlist=[attribute]), attribute)
            if not isinstance(command, click.Command):
                raise TypeError(f"{target} is not a click command")
            self._prepare(command)
            self._loaded[name] = command
        return command

    def __setitem__(self, name: str, command: click.Command) -> None:
        self.lazy.pop(name, None)
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        self.lazy.pop(name, None)
        self._loaded.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        yield from self.lazy
        yield from (name for name in self._loaded if name not in self.lazy)

    def __len__(self) -> int:
        return len(self.lazy.keys() | self._loaded.keys())

    def __contains__(self, name: object) -> bool:
        return name in self.lazy or name in self._loaded


class LazyGroup(OnceGroup):
    """A OnceGroup whose commands are `LazyCommands`: give `lazy` (name to
    `Lazy`) and `prepare` (what to do to each command as it is loaded)."""

    commands: LazyCommands

    def __init__(
        self,
        *args: Any,
        lazy: Mapping[str, Lazy],
        prepare: Callable[[click.Command], None],
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.commands = LazyCommands(lazy, prepare)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The list of commands as click writes it, each line made from the
        command's summary while the command is not loaded."""
        listed: dict[str, click.Command] = {}
        for name in self.commands:
            command = self.commands.loaded(name)
            if command is None:  # a stand-in click shortens as it would the real help
                command = click.Command(name, help=self.commands.lazy[name].summary)
            listed[name] = command
        click.Group(self.name, commands=listed).format_commands(ctx, formatter)
