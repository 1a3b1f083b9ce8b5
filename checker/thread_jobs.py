"""How the standard library's thread runners call the job they are handed.

``pool.submit(fn, inp)`` runs ``fn(inp)`` on a worker thread, and ``Thread(target=fn, args=(inp,))``
runs it when started. The runtime refuses stale host ids on every thread (the entry point marks its
input as handed to the forward), so such a job is the call it is, only elsewhere: the checker follows
it as that call instead of calling it out of sight (RCK-60). Process pools are not runners here: their
job gets a pickled copy of the input, in another interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tokenstate.checker.values import MapV, Seq, Value

__all__ = ["JobCall", "thread_job_call"]

_POOLS = ("concurrent.futures.ThreadPoolExecutor", "concurrent.futures.thread.ThreadPoolExecutor")


@dataclass(frozen=True, slots=True)
class JobCall:
    """``job(*args, **kwargs)`` as a runner makes it; ``gives`` is what the runner's call returns:
    a ``future`` of the job's result, a ``map`` of its results over the argument iterables, the
    ``thread`` object, or the ``result`` itself (``await asyncio.to_thread(...)``)."""

    job: Value
    args: tuple[Value, ...]
    kwargs: tuple[tuple[str, Value], ...]
    gives: Literal["future", "map", "thread", "result"]


def thread_job_call(runner: str, args: tuple[Value, ...], kwargs: tuple[tuple[str, Value], ...]) -> JobCall | None:
    """The call ``runner`` (a dotted function or ``Class.method``) makes of the job among its
    arguments, or ``None`` for a callee that is no thread runner or whose job arguments are not known
    item by item (``args=some_list``)."""
    owner, _, name = runner.rpartition(".")
    if owner in _POOLS and name == "submit" and args:
        return JobCall(args[0], args[1:], kwargs, "future")
    if owner in _POOLS and name == "map" and args:
        return JobCall(args[0], args[1:], (), "map")  # timeout=, chunksize= are the pool's own
    if runner == "asyncio.to_thread" and args:
        return JobCall(args[0], args[1:], kwargs, "result")
    if runner == "threading.Thread":  # Thread(group, target, name, args, kwargs)
        return _thread(_argument(args, kwargs, 1, "target"), _argument(args, kwargs, 3, "args"), _argument(args, kwargs, 4, "kwargs"))
    if runner == "threading.Timer":  # Timer(interval, function, args, kwargs)
        return _thread(_argument(args, kwargs, 1, "function"), _argument(args, kwargs, 2, "args"), _argument(args, kwargs, 3, "kwargs"))
    return None


def _argument(args: tuple[Value, ...], kwargs: tuple[tuple[str, Value], ...], index: int, keyword: str) -> Value | None:
    return args[index] if len(args) > index else dict(kwargs).get(keyword)


def _thread(target: Value | None, job_args: Value | None, job_kwargs: Value | None) -> JobCall | None:
    if target is None:
        return None
    positional: tuple[Value, ...] = ()
    if job_args is not None:
        if not (isinstance(job_args, Seq) and job_args.items is not None):
            return None
        positional = job_args.items
    keywords: tuple[tuple[str, Value], ...] = ()
    if job_kwargs is not None:
        if not (isinstance(job_kwargs, MapV) and job_kwargs.items is not None and all(isinstance(k, str) for k, _ in job_kwargs.items)):
            return None
        keywords = tuple((str(k), v) for k, v in job_kwargs.items)
    return JobCall(target, positional, keywords, "thread")
