"""Whatever is thrown at the loaders, they either load it or raise one SpecError line at a real line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.errors import SpecError
from orchestrator.spec import inventory_from_text, job_from_text
from orchestrator.spec.yamlsrc import load_yaml

REPO = Path(__file__).resolve().parents[1]
PATH = "fuzz.yaml"
FUZZ = settings(max_examples=300, deadline=None)

# This test file stands in for the job's script: it exists wherever the tests run from.
JOB = f"""\
name: resnet50
script: '{Path(__file__).resolve()}'
args: [--steps, "50"]
nnodes: 2
nproc_per_node: auto
workdir: /shared/project
env: {{NCCL_DEBUG: WARN, WANDB_API_KEY: "${{env:WANDB_API_KEY}}"}}
rendezvous: {{backend: static, port: auto}}
max_restarts: 0
select:
  names: [node0, node1]
  labels: []
telemetry: {{interval: 2, enabled: true}}
slurm: {{partition: gpu, time: "1:00:00", extra: [--exclusive]}}
"""
INVENTORY = (REPO / "inventory" / "example.yaml").read_text()
LOADERS: list[Callable[[str, str], object]] = [job_from_text, inventory_from_text]

KEYS = [
    *("name", "script", "module", "args", "nnodes", "nproc_per_node", "workdir", "env", "rendezvous"),
    *("max_restarts", "select", "telemetry", "sync", "sync_max_size", "backend", "slurm", "heartbeat_timeout"),
    *("stop_grace",),
    *("defaults", "master", "nodes", "host", "user", "port", "identity_file", "known_hosts", "host_key_policy"),
    *("python", "iface", "gpus", "labels", "proxy_jump", "transport", "names", "interval", "enabled", "extra"),
]
VALUES = [
    *("", "null", "~", "true", "yes", "no", "-3", "0", "1", "70000", "1.5", ".inf", ".nan", "0x1F", "1:30"),
    *("[]", "{}", "[a, 1]", "{x: 1}", "[[1]]", '"${env:X}"', "'x${env:Y}'", "auto", "strict", "local"),
    *("&a x", "*a", "!!int x", "!!binary x", "!foo x", "\t", "'", '"', "[", "{", "- x", ": x", "? x", "%", "|", ">"),
]

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12) | st.sampled_from(VALUES)
keys = st.sampled_from(KEYS) | st.text(max_size=8)
documents = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=5),
    max_leaves=25,
)
top_levels = st.dictionaries(keys, documents, max_size=6) | documents


def check(load: Callable[[str, str], object], text: str) -> None:
    """Loading either succeeds or raises a SpecError that names this file and a line >= 1, on one line."""
    try:
        load(text, PATH)
    except SpecError as err:
        assert err.line >= 1
        assert str(err).startswith(f"{PATH}:{err.line}: ")
        assert "\n" not in str(err)


def mutate(text: str, data: st.DataObject) -> str:
    lines = text.splitlines(keepends=True)
    if not lines:
        return data.draw(st.sampled_from(VALUES))
    index = data.draw(st.integers(0, len(lines) - 1))
    kind = data.draw(st.sampled_from(["delete", "duplicate", "retype", "mangle_key", "truncate", "insert"]))
    line = lines[index]
    if kind == "delete":
        del lines[index]
    elif kind == "duplicate":
        lines.insert(index, line)
    elif kind == "retype" and ":" in line:
        lines[index] = line.split(":", 1)[0] + ": " + data.draw(st.sampled_from(VALUES)) + "\n"
    elif kind == "mangle_key" and ":" in line:
        key, rest = line.split(":", 1)
        position = data.draw(st.integers(0, len(key)))
        lines[index] = key[:position] + data.draw(st.text(max_size=2)) + key[position + 1 :] + ":" + rest
    elif kind == "truncate":
        return text[: data.draw(st.integers(0, len(text)))]
    else:
        lines.insert(index, data.draw(st.text(max_size=20) | st.sampled_from(VALUES)) + "\n")
    return "".join(lines)


@FUZZ
@given(document=top_levels)
def test_any_yaml_document_loads_or_raises_spec_error(document: object) -> None:
    text = yaml.safe_dump(document)
    for load in LOADERS:
        check(load, text)


@FUZZ
@given(text=st.text())
def test_any_text_loads_or_raises_spec_error(text: str) -> None:
    for load in LOADERS:
        check(load, text)


@FUZZ
@given(data=st.binary())
def test_any_bytes_parse_or_raise_spec_error(data: bytes) -> None:
    try:
        load_yaml(data, PATH)
    except SpecError as err:
        assert err.line >= 1


@FUZZ
@given(data=st.data())
def test_mutated_job_loads_or_raises_spec_error(data: st.DataObject) -> None:
    text = JOB
    for _ in range(data.draw(st.integers(1, 3))):
        text = mutate(text, data)
    check(job_from_text, text)


@FUZZ
@given(data=st.data())
def test_mutated_inventory_loads_or_raises_spec_error(data: st.DataObject) -> None:
    text = INVENTORY
    for _ in range(data.draw(st.integers(1, 3))):
        text = mutate(text, data)
    check(inventory_from_text, text)


def test_unmutated_examples_load() -> None:
    assert job_from_text(JOB, PATH).secrets == {"WANDB_API_KEY": "WANDB_API_KEY"}
    assert len(inventory_from_text(INVENTORY, PATH).nodes) == 3
