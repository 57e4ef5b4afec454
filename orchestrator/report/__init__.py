"""The comparison report: one self-contained HTML page about finished jobs; and `distrun trace`,
a job's run as one Chrome Trace Event timeline.

The table's numbers come from pure functions over a job's files (`summarize`,
`pick_baseline`, `scaling_efficiency`), so a test or a reader can recompute them from
metrics.jsonl. Plots are matplotlib SVGs inlined as data URIs and the CSS is inline: the
page opens with no network.

    numbers.py  reading a job's files and the table's numbers (pure)
    plots.py    the matplotlib figures
    page.py     the HTML page (`render`, `write_report`)
    timeline.py the ranks' collectives on one clock, from collectives.jsonl (pure)
    events.py   alerts (as data or as older sentences), failures and attempts, timed
    sources.py  a rank's lines with their times; what a job's records lack, a line each
    runs.py     a run's figures for any program: wall time, collective and step rate, lateness
    runplots.py the collective rate and the lateness heat map
    trace.py    the trace (`build`, `write_trace`)
"""
