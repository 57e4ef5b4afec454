"""`distrun bench` around a stand-in launcher: order, job ids, failures, interruption, bad input."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.errors import InfraError, SpecError, UsageError
from orchestrator.report.compare import BenchRequest, expand, run_bench
from orchestrator.run import launch
from orchestrator.run.request import LaunchRequest
from orchestrator.store import JobState, Store
from tests.helpers import distrun
from tests.test_report import make_job, metric_rows, table

INVENTORY = "nodes:\n  - {name: localhost, host: localhost, transport: local}\n"


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv("DISTRUN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DISTRUN_INVENTORY", raising=False)
    return Store()


@pytest.fixture
def job_files(tmp_path: Path) -> list[str]:
    """Three valid job files, named so that their directory lists them in run order."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    paths = []
    for order, name in enumerate(("single", "ddp", "fsdp")):
        path = tmp_path / "jobs" / f"{order}-{name}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(f"name: {name}\nscript: {tmp_path / 'train.py'}\n")
        paths.append(str(path))
    return paths


@pytest.fixture
def inventory(tmp_path: Path) -> str:
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY)
    return str(path)


class FakeLaunch:
    """Stands in for `launch.launch`: records the request and the job as a real launch would."""

    def __init__(self, store: Store, outcomes: dict[str, JobState | Exception] | None = None) -> None:
        self.store = store
        self.outcomes = outcomes or {}
        self.requests: list[LaunchRequest] = []

    def __call__(self, request: LaunchRequest) -> int:
        self.requests.append(request)
        name = Path(request.job_file).stem.split("-", 1)[1]
        outcome = self.outcomes.get(name, JobState.SUCCEEDED)
        if isinstance(outcome, Exception):
            raise outcome
        world = 1 if name == "single" else 2
        record = make_job(self.store, request.job_id or "", [("localhost", world)],
                          metric_rows(name, world), state=outcome)
        code = {JobState.SUCCEEDED: 0, JobState.FAILED: 1, JobState.STOPPED: 130}[outcome]
        self.store.update(record.id, exit_code=code)
        return code


def bench(store: Store, monkeypatch: pytest.MonkeyPatch, args: list[str], inventory: str | None, output: Path,
          outcomes: dict[str, JobState | Exception] | None = None) -> tuple[int, FakeLaunch, list[str]]:
    fake = FakeLaunch(store, outcomes)
    monkeypatch.setattr(launch, "launch", fake)
    said: list[str] = []
    return run_bench(BenchRequest(args, inventory, output), said.append), fake, said


def test_bench_runs_job_files_in_order_with_the_inventory_and_reports_them(
        store: Store, monkeypatch: pytest.MonkeyPatch, job_files: list[str], inventory: str, tmp_path: Path) -> None:
    code, fake, said = bench(store, monkeypatch, job_files, inventory, tmp_path / "r.html")

    ids = [r.job_id for r in fake.requests]
    assert code == 0
    assert [r.job_file for r in fake.requests] == job_files
    assert all(r.inventory == inventory and r.live is False for r in fake.requests)
    assert [i.rsplit("-", 3)[0] for i in ids if i] == ["single", "ddp", "fsdp"]
    assert list(table((tmp_path / "r.html").read_text())) == ids
    assert said[-1] == f"bench: report written to {(tmp_path / 'r.html').resolve()}"


def test_a_failed_job_marks_its_row_and_makes_the_exit_status_1(
        store: Store, monkeypatch: pytest.MonkeyPatch, job_files: list[str], inventory: str, tmp_path: Path) -> None:
    code, fake, said = bench(store, monkeypatch, job_files, inventory, tmp_path / "r.html",
                             {"ddp": JobState.FAILED})

    page = (tmp_path / "r.html").read_text()
    failed_id = fake.requests[1].job_id
    assert code == 1 and len(fake.requests) == 3
    assert f"class=failed data-job={failed_id}" in page
    assert f"1 job(s) did not succeed: {failed_id}" in said[-1]


def test_a_launch_that_fails_before_recording_the_job_still_gets_a_row(
        store: Store, monkeypatch: pytest.MonkeyPatch, job_files: list[str], inventory: str, tmp_path: Path) -> None:
    unreachable = InfraError("node1: connection refused")
    code, fake, _ = bench(store, monkeypatch, job_files, inventory, tmp_path / "r.html", {"single": unreachable})

    rows = table((tmp_path / "r.html").read_text())
    assert code == 1 and len(fake.requests) == 3
    assert "did not start: node1: connection refused" in rows[fake.requests[0].job_id or ""]["Notes"]
    assert "No single-process baseline in this set" in (tmp_path / "r.html").read_text()


def test_an_interrupted_job_ends_the_bench_with_its_exit_status(
        store: Store, monkeypatch: pytest.MonkeyPatch, job_files: list[str], inventory: str, tmp_path: Path) -> None:
    code, fake, said = bench(store, monkeypatch, job_files, inventory, tmp_path / "r.html",
                             {"ddp": JobState.STOPPED})

    assert code == 130 and len(fake.requests) == 2
    assert "the remaining jobs were not run" in said[-2]
    assert len(table((tmp_path / "r.html").read_text())) == 2


def test_finished_job_ids_and_a_directory_of_job_files_mix(
        store: Store, monkeypatch: pytest.MonkeyPatch, job_files: list[str], inventory: str, tmp_path: Path) -> None:
    earlier = make_job(store, "single-old-0001", [("localhost", 1)], metric_rows("single", 1))

    code, fake, _ = bench(store, monkeypatch, ["single-old", str(Path(job_files[0]).parent)], inventory,
                          tmp_path / "r.html")

    assert code == 0 and [r.job_file for r in fake.requests] == job_files
    assert list(table((tmp_path / "r.html").read_text())) == [earlier.id, *(r.job_id for r in fake.requests)]


def test_a_finished_failed_job_given_by_id_makes_the_exit_status_1(
        store: Store, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    make_job(store, "ddp-bad-0002", [("localhost", 2)], metric_rows("ddp", 2), state=JobState.FAILED)

    code, fake, _ = bench(store, monkeypatch, ["ddp-bad-0002"], None, tmp_path / "r.html")

    assert code == 1 and fake.requests == []
    assert (tmp_path / "r.html").exists()


def test_every_argument_is_checked_before_any_job_runs(
        store: Store, monkeypatch: pytest.MonkeyPatch, job_files: list[str], inventory: str, tmp_path: Path) -> None:
    fake = FakeLaunch(store)
    monkeypatch.setattr(launch, "launch", fake)
    broken = Path(job_files[2])
    broken.write_text(broken.read_text() + "nnodez: 2\n")

    with pytest.raises(SpecError, match="nnodez"):
        run_bench(BenchRequest(job_files, inventory, tmp_path / "r.html"))
    with pytest.raises(UsageError, match=r"jobs/missing\.yaml: no such job file"):
        run_bench(BenchRequest([job_files[0], "jobs/missing.yaml"], inventory, tmp_path / "r.html"))
    with pytest.raises(UsageError, match="no job matches 'nosuchjob'"):
        run_bench(BenchRequest([job_files[0], "nosuchjob"], inventory, tmp_path / "r.html"))
    with pytest.raises(UsageError, match="cannot read inventory"):
        run_bench(BenchRequest([job_files[0]], str(tmp_path / "none.yaml"), tmp_path / "r.html"))
    assert fake.requests == []
    assert not (tmp_path / "r.html").exists()


def test_a_directory_without_job_files_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no job files"):
        expand([str(tmp_path)])


def test_bench_command_exits_2_on_a_missing_job_file(tmp_path: Path) -> None:
    result = distrun("bench", "jobs/compare/nope.yaml", "-o", str(tmp_path / "r.html"), home=tmp_path / "home")

    assert result.returncode == 2
    assert "jobs/compare/nope.yaml: no such job file" in result.stderr


class ScalingLaunch(FakeLaunch):
    """Records each run on its first `nnodes` hosts, throughput growing less than linearly with them."""

    def __call__(self, request: LaunchRequest) -> int:
        self.requests.append(request)
        hosts = [(f"node{i}", 2) for i in range(request.nnodes or 1)]
        rate = 100.0 * (1.0 if len(hosts) == 1 else 0.9)
        make_job(self.store, request.job_id or "", hosts, metric_rows("ddp", 2 * len(hosts), rate=rate))
        return 0


def test_hosts_runs_each_job_at_each_host_count_and_reports_efficiency_against_hosts(
        store: Store, monkeypatch: pytest.MonkeyPatch, job_files: list[str], tmp_path: Path) -> None:
    inventory = tmp_path / "three.yaml"
    inventory.write_text("nodes:\n" + "".join(f"  - {{name: node{i}}}\n" for i in range(3)))
    fake = ScalingLaunch(store)
    monkeypatch.setattr(launch, "launch", fake)

    code = run_bench(BenchRequest([job_files[1]], str(inventory), tmp_path / "r.html", host_counts=[1, 2, 3]),
                     lambda _text: None)

    assert code == 0 and [r.nnodes for r in fake.requests] == [1, 2, 3]
    page = (tmp_path / "r.html").read_text()
    scaling = page[page.index("<table id=scaling>"):page.index("</table>", page.index("<table id=scaling>"))]
    rows = re.findall(r"<td class=num>(\d+)</td><td class=num>(\d+)</td><td class=num>([\d.]+)</td>"
                      r"<td class=num>([\d.]+)×</td><td class=num>([\d.]+)%</td>", scaling)
    hosts = [int(r[0]) for r in rows]
    efficiency = [float(r[4]) for r in rows]
    assert hosts == [1, 2, 3]
    assert efficiency[0] == 100.0 and efficiency[1] == pytest.approx(90.0, abs=0.2)
    assert 'alt="throughput and scaling efficiency against hosts"' in page


def test_a_host_count_above_the_selection_is_refused_before_anything_runs(
        store: Store, monkeypatch: pytest.MonkeyPatch, job_files: list[str], inventory: str, tmp_path: Path) -> None:
    fake = ScalingLaunch(store)
    monkeypatch.setattr(launch, "launch", fake)

    with pytest.raises(UsageError, match=r"^--nnodes 2: must be from 1 to the number of selected nodes, 1"):
        run_bench(BenchRequest([job_files[0]], inventory, tmp_path / "r.html", host_counts=[1, 2]))
    assert fake.requests == []


def test_hosts_must_be_counts(tmp_path: Path) -> None:
    result = distrun("bench", "jobs/tiny.yaml", "--hosts", "1,two", "-o", str(tmp_path / "r.html"),
                     home=tmp_path / "home")

    assert result.returncode == 2 and "--hosts 1,two: give host counts separated by commas" in result.stderr
