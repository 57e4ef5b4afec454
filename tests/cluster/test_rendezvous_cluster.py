"""A launch whose hosts cannot all reach the rendezvous (3 namespace hosts, one whose packets to the
master's port are dropped): the screen says what it waits for, then names that host."""

from __future__ import annotations

import signal

from tests.helpers import unique_job_id, wait_for

from .test_launch_cluster import job_procs, output, record, start, wait_for_line, write_job

PORT = 29531
BOUND = 15


def drop_rule(cluster3, action: str) -> list[str]:
    """iptables in node2: drop (`-I`) or stop dropping (`-D`) its TCP packets to the master's rendezvous port."""
    return ["iptables", action, "OUTPUT", "-p", "tcp", "-d", cluster3.addr(0), "--dport", str(PORT), "-j", "DROP"]


def test_a_host_that_cannot_reach_the_rendezvous_port_is_named_after_the_bound_and_nothing_is_left(
        cluster3, tmp_path):
    inv = cluster3.write_inventory(tmp_path / "inv.yaml")
    job_id = unique_job_id("rdzv-cut")
    home = tmp_path / "home"
    job = write_job(tmp_path, args=["--sleep", "1"], extra=f"rendezvous: {{port: {PORT}, report_after: {BOUND}}}\n")
    added = cluster3.host_run(2, drop_rule(cluster3, "-I"))
    assert added.returncode == 0, added.stderr
    proc = None
    try:
        # The preflight's port-reachable would refuse the launch: what it cannot catch (a rule that comes
        # later, a port it tested otherwise) is what this watch is for.
        proc = start(job, inv, home, job_id, "--skip-preflight", "--no-live")
        wait_for_line(home, job_id, "never joined within", timeout=BOUND + 120)
        said = output(home, job_id)
        where = f"node0 {cluster3.addr(0)}:{PORT}"
        assert f"[node0] distrun: waiting for the rendezvous at {where} for " in said, said
        assert "(3 of 3 hosts started torchrun, 2 connected to it, no rank past it yet)" in said, said
        assert (f"[node2] distrun: ALERT never joined the rendezvous at {where} in {BOUND} s: its torchrun's "
                "connection to it gets no answer (a firewall drops its SYNs, or no route)") in said, said
        assert f"[node0] distrun: node2 never joined within {BOUND} s: check that they reach node0's port {PORT}" \
            in said, said
        assert "ALERT never joined" not in said.replace("[node2] distrun: ALERT never joined", ""), said
        alerts = record(home, job_id)["alerts"]
        assert len(alerts) == 1 and (alerts[0]["node"], alerts[0]["rule"]) == ("node2", "rendezvous"), alerts
        assert alerts[0]["message"].startswith("never joined the rendezvous"), alerts
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        assert proc.returncode == 130, output(home, job_id)[-2000:]
        assert wait_for(lambda: all(not p for p in job_procs(cluster3, job_id).values()), 20)
    finally:
        cluster3.host_run(2, drop_rule(cluster3, "-D"))
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_job_whose_ranks_start_normally_says_nothing_of_the_rendezvous(cluster3, tmp_path):
    inv = cluster3.write_inventory(tmp_path / "inv.yaml")
    job_id = unique_job_id("rdzv-ok")
    home = tmp_path / "home"
    job = write_job(tmp_path, args=["--sleep", "1"], extra=f"rendezvous: {{port: {PORT}, report_after: 20}}\n")
    proc = start(job, inv, home, job_id, "--no-live")
    assert proc.wait(timeout=180) == 0, output(home, job_id)[-3000:]
    said = output(home, job_id)
    assert "rendezvous" not in said, said
    assert not record(home, job_id)["alerts"]
