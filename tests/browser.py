"""Headless Chromium for tests: open a local page, take a screenshot, collect its console messages,
and find what was drawn where in the screenshot.

Chromium started with `--enable-logging=stderr` writes every console message of the page
(uncaught exceptions included) to stderr as `...:INFO:CONSOLE:<line>] "text", source: ...`.
The network stays off: no background services, no QUIC, and only file:// pages are opened.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np

CHROMIUM = "chromium"
CONSOLE = re.compile(r":CONSOLE[:(]\d+\)?\] (.*)")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--enable-logging=stderr", "--v=0")


@dataclass(frozen=True)
class PageShot:
    """What Chromium made of a page: the screenshot, the console messages, its whole stderr."""

    screenshot: Path
    console: list[str]
    stderr: str


def chromium() -> str | None:
    """The Chromium executable, or None when it is not installed."""
    return shutil.which(CHROMIUM)


def render(page: Path, screenshot: Path, width: int = 1400, height: int = 3000, timeout: float = 120) -> PageShot:
    """Load `page` in headless Chromium and save a `width` x `height` screenshot of it.

    Raises:
        FileNotFoundError: Chromium is not installed.
        RuntimeError: Chromium failed or wrote no screenshot.
    """
    exe = chromium()
    if exe is None:
        raise FileNotFoundError("chromium is not installed (apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        argv = [exe, *FLAGS, f"--user-data-dir={profile}", f"--screenshot={screenshot}",
                f"--window-size={width},{height}", page.resolve().as_uri()]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0 or not screenshot.exists():
        raise RuntimeError(f"chromium exited {result.returncode}: {result.stderr[-2000:]}")
    return PageShot(screenshot, [m.group(1) for m in CONSOLE.finditer(result.stderr)], result.stderr)


@dataclass(frozen=True)
class Box:
    """A rectangle of a screenshot in pixels, edges excluded."""

    left: int
    top: int
    right: int
    bottom: int


def load_rgb(png: Path) -> np.ndarray:
    """A PNG as an (height, width, 3) array of 0-255 integers."""
    return (mpimg.imread(png)[..., :3] * 255).round().astype(np.int16)


def colour_mask(image: np.ndarray, hex_colour: str, tolerance: int = 0) -> np.ndarray:
    """Where the screenshot has this `#rrggbb` colour (within `tolerance` per channel)."""
    rgb = np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)])
    return np.all(np.abs(image - rgb) <= tolerance, axis=-1)


def horizontal_runs(mask: np.ndarray, min_length: int) -> list[tuple[int, int, int]]:
    """Every (row, first column, last column) run of True at least `min_length` long."""
    runs = []
    for y in np.flatnonzero(mask.sum(axis=1) >= min_length):
        edges = np.flatnonzero(np.diff(np.concatenate(([0], mask[y].astype(np.int8), [0]))))
        runs += [(int(y), int(a), int(b) - 1) for a, b in zip(edges[::2], edges[1::2], strict=True)
                 if b - a >= min_length]
    return runs


def frames(mask: np.ndarray, min_width: int = 200) -> list[Box]:
    """Rectangles outlined in the mask: top and bottom edges of the same span, paired in row order."""
    spans: dict[tuple[int, int], list[list[int]]] = {}
    for y, left, right in horizontal_runs(mask, min_width):
        edges = spans.setdefault((left, right), [])
        if edges and edges[-1][-1] == y - 1:
            edges[-1].append(y)
        else:
            edges.append([y])
    boxes = []
    for (left, right), edges in spans.items():
        for top, bottom in zip(edges[::2], edges[1::2], strict=False):
            boxes.append(Box(left, top[-1] + 1, right, bottom[0] - 1))
    return sorted(boxes, key=lambda b: (b.top, b.left))


def inside(image: np.ndarray, box: Box, margin: int = 12) -> np.ndarray:
    """The part of the image within a box, `margin` pixels in from its edges."""
    return image[box.top + margin:box.bottom - margin, box.left + margin:box.right - margin]


def ink(region: np.ndarray) -> float:
    """The share of a region's pixels that are not white."""
    return float(np.any(region < 245, axis=-1).mean())


def line_groups(rows: list[int]) -> list[list[int]]:
    """Consecutive row numbers grouped: each group is one drawn line or band."""
    groups: list[list[int]] = []
    for y in rows:
        if groups and groups[-1][-1] == y - 1:
            groups[-1].append(y)
        else:
            groups.append([y])
    return groups


def table_rows(image: np.ndarray, hex_colour: str, min_width: int = 1000) -> tuple[list[int], list[Box]]:
    """The first wide table drawn in this colour: its header band's rows and a box per body row.

    Body rows are the spaces between the border lines under the header band.
    """
    mask = colour_mask(image, hex_colour)
    _, left, right = horizontal_runs(mask, min_width)[0]
    coverage = mask[:, left:right + 1].mean(axis=1)
    header, *rest = line_groups([int(y) for y in np.flatnonzero(coverage > 0.5)])
    borders = [header]
    for group in rest:
        if len(group) > 2 or group[0] - borders[-1][-1] > 400:
            break
        borders.append(group)
    rows = [Box(left, above[-1] + 1, right, below[0] - 1) for above, below in pairwise(borders)]
    return header, rows
