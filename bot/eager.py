"""A coroutine's first step taken at once, so that a tool or a hook which answers without
waiting pays for no timer and no guard: an instant in-process tool is most of a busy run's
calls, and the PII guard's hooks never wait."""

from collections.abc import Awaitable, Coroutine, Generator
from types import CoroutineType
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Started(Generic[T]):
    """A coroutine stepped once: either finished (``done``, with its ``result``) or waiting on
    what it yielded, and then awaiting this goes on with it exactly as awaiting it would."""

    __slots__ = ("_coro", "_waiting", "done", "result")

    def __init__(self, coro: Coroutine[Any, Any, T]) -> None:
        self._coro = coro
        self._waiting: object = None
        self.done = False
        self.result: T | None = None
        try:
            self._waiting = coro.send(None)
        except StopIteration as finished:
            self.done, self.result = True, finished.value

    def __await__(self) -> Generator[Any, None, T]:
        """Hand the task what the coroutine waits on, and pass back whatever the task sends or
        throws in (a cancellation), until it returns."""
        coro, waiting = self._coro, self._waiting
        while True:
            try:
                yield waiting
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # thrown in by the task (a cancellation): passed on
                thrown: BaseException | None = exc
            else:
                thrown = None
            try:
                waiting = coro.send(None) if thrown is None else coro.throw(thrown)
            except StopIteration as finished:
                value: T = finished.value
                return value


def started(awaitable: Awaitable[T]) -> Started[T] | None:
    """``awaitable`` stepped once, if it is a native coroutine; None for any other awaitable,
    which is then awaited as it is."""
    if not isinstance(awaitable, CoroutineType):
        return None
    return Started(awaitable)
