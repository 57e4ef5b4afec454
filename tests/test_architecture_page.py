"""ARCHITECTURE.md stays true: every path it names exists, its backend hooks are Backend's, and the
layer check's circle finder finds circles."""

from __future__ import annotations

import re

from orchestrator.backends.base import Backend
from tests.test_layers import ARCHITECTURE, REPO, circles

LINK = re.compile(r"\]\(((?:orchestrator|tests|docs|bench|jobs)/[^)#\s]*)\)")
NAMED_PATH = re.compile(r"`((?:orchestrator|tests)/[\w/.]+\.py)`")


def section(text: str, title: str) -> str:
    """The text of one `## title` section."""
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def backticked(text: str, start: str, end: str) -> set[str]:
    """The `names` between the first `start` and the next `end`."""
    part = text.split(start, 1)[1].split(end, 1)[0]
    return set(re.findall(r"`(\w+)`", part))


def test_every_path_the_page_links_or_names_exists() -> None:
    text = ARCHITECTURE.read_text()
    paths = {m for m in LINK.findall(text)} | set(NAMED_PATH.findall(text))
    assert paths, "the page links no file: the pattern no longer reads it"
    assert sorted(p for p in paths if not (REPO / p).exists()) == []


def test_the_backend_hooks_the_page_lists_are_backends_public_methods() -> None:
    contract = section(ARCHITECTURE.read_text(), "The backend contract")
    listed = backticked(contract, "hooks the run loop calls", "and operations on recorded jobs")
    listed |= backticked(contract, "operations on recorded jobs", ").")
    public = {name for name, value in vars(Backend).items() if callable(value) and not name.startswith("_")}
    assert listed == public - {"resolve_options"}


def test_circles_names_each_group_of_modules_that_import_each_other() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set(), "f": {"f"}}
    assert circles(graph) == [["a", "b", "c"]]
