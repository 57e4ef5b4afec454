"""The comparison report: one self-contained HTML page about finished jobs.

The table's numbers come from pure functions over a job's files (`summarize`,
`pick_baseline`, `scaling_efficiency`), so a test or a reader can recompute them from
metrics.jsonl. Plots are matplotlib SVGs inlined as data URIs and the CSS is inline: the
page opens with no network.

    numbers.py  reading a job's files and the table's numbers (pure)
    plots.py    the matplotlib figures
    page.py     the HTML page (`render`, `write_report`)
"""
