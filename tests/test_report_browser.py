"""The report page in a real browser (headless Chromium): no console errors, and pixels where
the table and the plots should be."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from orchestrator.report.numbers import JobData
from orchestrator.report.page import PLOT_FRAME_COLOUR, TABLE_HEAD_COLOUR, write_report
from orchestrator.report.plots import JOB_COLOURS
from orchestrator.report.runplots import MARK_COLOUR, RATE_COLOUR
from orchestrator.store import JobState, Store
from tests.browser import (
    Box,
    chromium,
    colour_mask,
    frames,
    horizontal_runs,
    ink,
    inside,
    load_rgb,
    render,
    table_rows,
)
from tests.test_report import make_job, metric_rows, standard_set
from tests.test_trace import T0, recorded_job, synthetic_job, synthetic_rows

pytestmark = pytest.mark.skipif(chromium() is None, reason="chromium is not installed "
                                "(tests/install-system-deps.sh installs it when run as root)")

WIDTH, HEIGHT = 1400, 5000


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv("DISTRUN_HOME", str(tmp_path / "home"))
    return Store()


def test_helper_catches_an_uncaught_error_and_console_messages(tmp_path: Path) -> None:
    page = tmp_path / "broken.html"
    page.write_text("<html><body><p>x</p><script>console.error('logged-e');throw new Error('deliberate-x')"
                    "</script></body></html>")

    shot = render(page, tmp_path / "broken.png", 400, 300)

    assert any("Uncaught Error: deliberate-x" in line for line in shot.console), shot.stderr[-3000:]
    assert any("logged-e" in line for line in shot.console)


def test_report_renders_without_console_messages(store: Store, tmp_path: Path) -> None:
    page = write_report(standard_set(store), tmp_path / "report.html")

    shot = render(page, tmp_path / "report.png", WIDTH, HEIGHT)

    assert shot.console == []


@pytest.fixture
def screenshot(store: Store, tmp_path: Path) -> np.ndarray:
    page = write_report(standard_set(store), tmp_path / "report.html")
    return load_rgb(render(page, tmp_path / "report.png", WIDTH, HEIGHT).screenshot)


def test_screenshot_shows_seven_framed_plots_with_curves_and_bars_in_them(screenshot: np.ndarray) -> None:
    boxes = frames(colour_mask(screenshot, PLOT_FRAME_COLOUR))

    # Throughput and memory bars, throughput and loss over steps, one telemetry plot per job (3).
    assert len(boxes) == 7, boxes
    for box in boxes:
        region = inside(screenshot, box)
        assert box.right - box.left >= 600 and box.bottom - box.top >= 250, box
        assert ink(region) > 0.03, box
        drawn = {c: int(colour_mask(region, c, tolerance=12).sum()) for c in JOB_COLOURS}
        assert drawn[JOB_COLOURS[0]] > 40, (box, drawn)
    assert boxes[-1].bottom < HEIGHT - 50, "the last plot runs past the screenshot"


def test_screenshot_shows_the_table_header_and_one_bordered_row_per_job(screenshot: np.ndarray) -> None:
    header, rows = table_rows(screenshot, TABLE_HEAD_COLOUR)

    assert len(header) >= 25, "the header band is missing"
    assert len(rows) == 3, rows
    for row in rows:
        assert np.any(inside(screenshot, row, 2) < 100, axis=-1).sum() > 200, f"no text in the table row {row}"


def test_the_table_fits_a_1280_pixel_window_notes_column_included(store: Store, tmp_path: Path) -> None:
    data = standard_set(store)
    failure = {"host": "node1", "kind": "exit", "rank": 3, "exit_code": 1, "address": "10.213.223.11",
               "last_lines": ["RuntimeError: deliberate failure on rank 3"], "time": 1.0}
    long_id = "compare-fsdp-20261121-143012-a3f9"
    failed = make_job(store, long_id, [("node0", 2), ("node1", 2)], metric_rows("fsdp", 4, rate=60.0),
                      state=JobState.FAILED, failures=[failure])
    page = write_report([*data, JobData.load(failed, store.job_dir(long_id))], tmp_path / "report.html")

    image = load_rgb(render(page, tmp_path / "narrow.png", 1280, 1200).screenshot)

    _, _, right = horizontal_runs(colour_mask(image, TABLE_HEAD_COLOUR), 600)[0]
    assert right < 1280 - 16, f"the table runs to x={right}: off a 1280 px window"
    _, rows = table_rows(image, TABLE_HEAD_COLOUR, min_width=600)
    assert len(rows) == 4
    notes = inside(image, Box(right - 150, rows[3].top, right, rows[3].bottom), 2)
    assert np.any(notes < 100, axis=-1).sum() > 100, "the failed row's notes are not drawn inside the table"


def test_screenshot_of_a_program_that_prints_nothing_shows_its_rate_lateness_and_straggler(
        store: Store, tmp_path: Path) -> None:
    quiet = recorded_job(store)  # a real 2-rank run of tests/data/trace/quiet_ddp.py
    rows = synthetic_rows(3, 2, 2000, late={4: 0.040, 5: 0.045}, every=400)
    alert = {"t": T0 + 60, "node": "node2", "rule": "straggler", "rank": 5, "message": "straggler: rank 5",
             "figures": {}}
    slowed = synthetic_job(store, "slowed", rows, 3, 2, alerts=[alert])
    data = [JobData.load(r, store.job_dir(r.id)) for r in (quiet, slowed)]
    page = write_report(data, tmp_path / "runs.html")

    shot = render(page, tmp_path / "runs.png", WIDTH, 4200)
    image = load_rgb(shot.screenshot)

    assert shot.console == []
    boxes = frames(colour_mask(image, PLOT_FRAME_COLOUR))
    # Per job: the collective rate, the lateness heat map, the telemetry; no empty throughput/loss/memory plot.
    assert len(boxes) == 6, boxes
    for box in boxes:
        assert ink(inside(image, box)) > 0.03, box
    rate_quiet, late_quiet, rate_slowed, late_slowed, _, _ = boxes
    for box in (rate_quiet, rate_slowed):
        assert colour_mask(inside(image, box), RATE_COLOUR, tolerance=12).sum() > 300, box
    assert colour_mask(inside(image, late_slowed), MARK_COLOUR, tolerance=12).sum() > 20, "no straggler mark"
    dark = np.all(inside(image, late_slowed) < 90, axis=-1).sum()
    assert dark > 5 * np.all(inside(image, late_quiet) < 90, axis=-1).sum() + 1000, "the late ranks do not stand out"
    print(f"screenshot of the report's run plots: {shot.screenshot}")
