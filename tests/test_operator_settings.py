"""The operator's settings: the config file, times on the command line, colour and progress on a terminal."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from orchestrator.cli.main import cli
from orchestrator.cli.options import default_map
from orchestrator.cli.timespec import parse_duration, parse_since
from orchestrator.console import terminal
from orchestrator.console.terminal import ColorMode, ProgressCounter
from orchestrator.errors import SpecError, UsageError
from orchestrator.run.recording import Launching
from orchestrator.run.request import LaunchRequest
from orchestrator.spec import resolve_inventory_path
from orchestrator.spec.config import config_path, load_config
from orchestrator.spec.model import JobSpec
from orchestrator.store import Store


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("DISTRUN_INVENTORY", raising=False)
    (tmp_path / "xdg" / "distrun").mkdir(parents=True)
    return tmp_path / "xdg" / "distrun" / "config.yaml"


# ---------------------------------------------------------------- the config file


def test_the_config_file_lives_under_xdg_config_home(config_home: Path) -> None:
    assert config_path() == config_home


def test_without_a_config_file_nothing_is_set(config_home: Path) -> None:
    config = load_config()
    assert (config.inventory, config.color, config.confirm_above, config.commands) == (None, None, None, {})


def test_the_config_files_inventory_comes_after_the_environment(config_home: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    inv = tmp_path / "lab.yaml"
    inv.write_text("nodes: [{name: a}, {name: b}]\n")
    other = tmp_path / "other.yaml"
    other.write_text("nodes: [{name: c}]\n")
    config_home.write_text(f"inventory: {inv}\ncolor: never\nconfirm_above: 3\n")

    assert [n.name for n in resolve_inventory_path(None).nodes] == ["a", "b"]
    monkeypatch.setenv("DISTRUN_INVENTORY", str(other))
    assert [n.name for n in resolve_inventory_path(None).nodes] == ["c"]
    assert [n.name for n in resolve_inventory_path(str(inv)).nodes] == ["a", "b"]
    config = load_config()
    assert (config.color, config.confirm_above) == ("never", 3)


def test_a_missing_configured_inventory_points_at_the_config_line(config_home: Path) -> None:
    config_home.write_text("color: auto\ninventory: /nowhere/lab.yaml\n")
    with pytest.raises(SpecError, match=rf"^{config_home}:2: inventory: no such inventory file /nowhere/lab\.yaml"):
        resolve_inventory_path(None)


@pytest.mark.parametrize(("text", "message"), [
    ("colour: never\n", "1: colour: unknown key (did you mean 'color'?)"),
    ("color: blue\n", "1: color: must be one of auto, always, never"),
    ("confirm_above: -1\n", "1: confirm_above"),
    ("commands: [ps]\n", "1: commands: must be a mapping of command names to options"),
])
def test_a_wrong_key_or_value_is_an_error_at_its_line(config_home: Path, text: str, message: str) -> None:
    config_home.write_text(text)
    with pytest.raises(SpecError) as caught:
        load_config()
    assert message in str(caught.value)


def test_command_defaults_become_clicks_default_map_with_dashes_or_underscores(config_home: Path) -> None:
    config_home.write_text("commands:\n  launch: {no-live: true, backend: ssh}\n  ps: {all: true}\n")
    assert default_map(cli, load_config()) == {"launch": {"no_live": True, "backend": "ssh"}, "ps": {"show_all": True}}


@pytest.mark.parametrize(("text", "message"), [
    ("commands:\n  lunch: {no_live: true}\n", ":2: commands.lunch: no such command (did you mean 'launch'?)"),
    ("commands:\n  ps:\n    alll: true\n", ":3: commands.ps.alll: distrun ps has no such option (did you mean 'all'?)"),
])
def test_an_unknown_command_or_option_in_the_config_is_named_with_the_closest(config_home: Path, text: str,
                                                                              message: str) -> None:
    config_home.write_text(text)
    with pytest.raises(SpecError) as caught:
        default_map(cli, load_config())
    assert message in str(caught.value)


# ---------------------------------------------------------------- times


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("30m", 1800), ("2h", 7200), ("7d", 604800),
                                              ("1w", 604800), ("1.5h", 5400)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, "--older-than") == seconds


def test_since_takes_a_time_ago_or_a_local_date() -> None:
    assert parse_since("2h", "--since", now=10_000.0) == 10_000.0 - 7200
    assert parse_since("2026-11-21 14:30", "--since") == parse_since("2026-11-21T14:30:00", "--since")
    with pytest.raises(UsageError, match=r"^--since 'yesterday': not a time \(a duration ago: 90s"):
        parse_since("yesterday", "--since")
    with pytest.raises(UsageError, match=r"^--older-than '7': not a duration"):
        parse_duration("7", "--older-than")


# ---------------------------------------------------------------- colour and progress


@pytest.fixture
def colour_mode():
    yield terminal.set_color_mode
    terminal.set_color_mode(ColorMode.AUTO)


def test_colour_follows_the_flag_then_no_color_then_the_terminal(colour_mode, monkeypatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert terminal.colour(Tty()) and not terminal.colour(io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not terminal.colour(Tty())
    colour_mode("always")
    assert terminal.colour(io.StringIO())
    colour_mode("never")
    monkeypatch.delenv("NO_COLOR")
    assert not terminal.colour(Tty())


def test_progress_counts_each_host_once_on_a_terminal_and_erases_itself() -> None:
    out = Tty()
    progress = ProgressCounter(3, "connected", out)
    for name in ("a", "b", "a", "c"):
        progress.tick(name)
    progress.clear()
    assert out.getvalue() == ("\r\x1b[2Kconnected 1/3\r\x1b[2Kconnected 2/3\r\x1b[2Kconnected 3/3\r\x1b[2K")
    assert progress.count == 3


def test_progress_writes_nothing_when_not_a_terminal_or_for_one_host() -> None:
    for out, total in ((io.StringIO(), 64), (Tty(), 1)):
        progress = ProgressCounter(total, "connected", out)
        progress.tick("a")
        progress.clear()
        assert out.getvalue() == ""


def test_only_y_or_yes_is_a_yes() -> None:
    answers = {"y\n": True, "YES\n": True, "\n": False, "": False, "n\n": False, "sure\n": False}
    for typed, expected in answers.items():
        assert terminal.ask_yes_no("go?", io.StringIO(typed), io.StringIO()) is expected


def test_a_launch_colours_its_lines_by_the_same_rule(colour_mode, monkeypatch, tmp_path: Path) -> None:
    def context(stream: io.StringIO | None) -> Launching:
        return Launching.of(LaunchRequest("x.yaml"), JobSpec(path="x.yaml", name="x"), "x-1", Store(tmp_path), stream)

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert context(Tty()).colour() and not context(io.StringIO()).colour() and not context(None).colour()
    monkeypatch.setenv("NO_COLOR", "1")
    assert not context(Tty()).colour()
    colour_mode("always")
    assert context(io.StringIO()).colour()
