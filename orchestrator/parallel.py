"""Run one function per host at once and collect a result or the exception for every host,
as fabric's ThreadingGroup does: a check over 64 hosts reports all 64."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

MAX_WORKERS = 64


def for_each(items: Iterable[T], fn: Callable[[T], R], key: Callable[[T], str]) -> dict[str, R | Exception]:
    """Call `fn` on every item in parallel.

    Returns:
        {key(item): the result, or the exception it raised}, in the items' order.
    """
    items = list(items)
    if not items:
        return {}
    with ThreadPoolExecutor(max_workers=min(MAX_WORKERS, len(items))) as pool:
        futures = [(key(item), pool.submit(fn, item)) for item in items]
        results: dict[str, R | Exception] = {}
        for name, future in futures:
            try:
                results[name] = future.result()
            except Exception as exc:
                results[name] = exc
        return results


def failures(results: dict[str, R | Exception]) -> dict[str, Exception]:
    return {k: v for k, v in results.items() if isinstance(v, Exception)}
