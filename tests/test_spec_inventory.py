"""Inventory files: defaults applied, the built-in inventory, resolution order, and one clear line per mistake."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from orchestrator.errors import SpecError, UsageError
from orchestrator.spec import (
    HostKeyPolicy,
    TransportKind,
    default_inventory,
    inventory_from_text,
    load_inventory,
    resolve_inventory_path,
)

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "inventory" / "example.yaml"
LOCAL = REPO / "inventory" / "local.yaml"


def error(text: str) -> str:
    with pytest.raises(SpecError) as caught:
        inventory_from_text(text, "inv.yaml")
    return str(caught.value)


def test_example_inventory_applies_defaults_to_every_node() -> None:
    inv = load_inventory(EXAMPLE)
    assert [node.name for node in inv.nodes] == ["node0", "node1", "node2"]
    assert inv.master == "node0"
    node0 = inv.node("node0")
    assert (node0.host, node0.user, node0.port, node0.gpus, node0.labels) == ("10.0.0.10", "root", 22, 8, ("h100",))
    assert node0.identity_file == "~/.ssh/id_ed25519"
    assert node0.host_key_policy is HostKeyPolicy.STRICT
    assert node0.transport is TransportKind.SSH
    assert node0.python == "/opt/venv/bin/python3"
    assert node0.iface == "eth0"


def test_node_values_override_defaults_and_env_merges_with_the_node_winning() -> None:
    inv = inventory_from_text(
        "defaults: {port: 22, env: {A: '1', B: '2'}}\nnodes:\n  - {name: n0, port: 2222, env: {B: three, C: x}}\n",
        "inv.yaml",
    )
    node = inv.nodes[0]
    assert node.port == 2222
    assert node.env == {"A": "1", "B": "three", "C": "x"}


def test_host_defaults_to_the_node_name() -> None:
    assert inventory_from_text("nodes: [{name: gpu-box.lan}]", "inv.yaml").nodes[0].host == "gpu-box.lan"


def test_env_numbers_and_booleans_are_kept_as_written() -> None:
    node = inventory_from_text("nodes: [{name: a, env: {N: 8, F: 1.50, B: true, Y: no}}]", "inv.yaml").nodes[0]
    assert node.env == {"N": "8", "F": "1.50", "B": "true", "Y": "no"}


def test_defaults_may_set_any_per_node_key_but_name_and_host() -> None:
    inv = inventory_from_text("defaults: {gpus: 8, proxy_jump: bastion}\nnodes: [{name: a}]", "inv.yaml")
    assert (inv.nodes[0].gpus, inv.nodes[0].proxy_jump) == (8, "bastion")
    assert error("defaults:\n  host: x\nnodes: [{name: a}]") == (
        "inv.yaml:2: defaults.host: 'host' cannot have a default (set it on each node under 'nodes')"
    )


def test_node_line_and_key_lines_are_recorded() -> None:
    inv = load_inventory(EXAMPLE)
    assert inv.node("node1").line == inv.lines["nodes[1]"]
    assert inv.lines["master"] == 13


def test_built_in_inventory_is_one_local_node() -> None:
    inv = default_inventory()
    assert inv.path == "<built-in>"
    assert [(node.name, node.host, node.transport) for node in inv.nodes] == [
        ("localhost", "localhost", TransportKind.LOCAL)
    ]


def test_inventory_local_yaml_is_the_built_in_inventory_but_for_its_python() -> None:
    built_in = default_inventory().nodes
    assert [dataclasses.replace(n, python="python3") for n in built_in] == list(load_inventory(LOCAL).nodes)


def test_built_in_inventory_runs_jobs_with_the_interpreter_running_distrun() -> None:
    assert default_inventory().nodes[0].python == sys.executable


def test_resolution_prefers_the_cli_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTRUN_INVENTORY", str(LOCAL))
    assert len(resolve_inventory_path(str(EXAMPLE)).nodes) == 3


def test_resolution_falls_back_to_the_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTRUN_INVENTORY", str(EXAMPLE))
    assert len(resolve_inventory_path(None).nodes) == 3


def test_resolution_falls_back_to_the_built_in_inventory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DISTRUN_INVENTORY", raising=False)
    assert resolve_inventory_path(None) == default_inventory()


def test_missing_file_named_by_the_environment_variable_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTRUN_INVENTORY", "/nonexistent/inv.yaml")
    with pytest.raises(UsageError) as caught:
        resolve_inventory_path(None)
    assert str(caught.value) == (
        "DISTRUN_INVENTORY=/nonexistent/inv.yaml: no such inventory file "
        "(fix the path, or unset DISTRUN_INVENTORY to use the built-in localhost inventory)"
    )


def test_missing_file_given_with_i_is_a_usage_error() -> None:
    with pytest.raises(UsageError) as caught:
        resolve_inventory_path("/nonexistent/inv.yaml")
    assert not isinstance(caught.value, SpecError)
    assert str(caught.value) == "cannot read inventory /nonexistent/inv.yaml: No such file or directory"


def test_file_that_is_not_utf8_is_a_spec_error(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_bytes(b"nodes:\n  - name: caf\xe9\n")
    with pytest.raises(SpecError) as caught:
        load_inventory(path)
    assert str(caught.value) == f"{path}:2: invalid YAML: not UTF-8 text (byte 0xe9) (save the file as UTF-8)"


PORT_TOO_HIGH = """\
nodes:
  - name: node0
    host: a
    gpus: 8
    labels: [x]
  - name: node1
    port: 70000
"""

MISSING_NAME = """\
nodes:
  - name: node0
  - host: 10.0.0.11
    port: 22
"""

DUPLICATE_NAME = """\
nodes:
  - name: node0
  - name: node1
  - host: b
    name: node0
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            PORT_TOO_HIGH, "inv.yaml:7: nodes[1].port: must be an integer from 1 to 65535, got 70000", id="port-range"
        ),
        pytest.param(
            "nodes:\n  - {name: a, port: '22'}",
            "inv.yaml:2: nodes[0].port: must be an integer, got string '22'",
            id="port-string",
        ),
        pytest.param(
            "nodes:\n  - {name: a, gpus: true}",
            "inv.yaml:2: nodes[0].gpus: must be an integer, got boolean true",
            id="bool-is-not-int",
        ),
        pytest.param(
            "nodes:\n  - {name: a, gpus: -1}",
            "inv.yaml:2: nodes[0].gpus: must be an integer >= 0, got -1",
            id="negative-gpus",
        ),
        pytest.param(MISSING_NAME, "inv.yaml:3: nodes[1]: missing required key 'name'", id="missing-name"),
        pytest.param(
            DUPLICATE_NAME,
            "inv.yaml:5: nodes[2].name: duplicate node name 'node0' "
            "(node names must be unique; the first 'node0' is at line 2)",
            id="duplicate-name",
        ),
        pytest.param(
            "master: nod0\nnodes: [{name: node0}, {name: node1}]",
            "inv.yaml:1: master: 'nod0' is not a node of this inventory (did you mean 'node0'?)",
            id="unknown-master-close",
        ),
        pytest.param(
            "master: zzz\nnodes: [{name: node0}, {name: node1}]",
            "inv.yaml:1: master: 'zzz' is not a node of this inventory (valid nodes: node0, node1)",
            id="unknown-master-far",
        ),
        pytest.param(
            "defaults:\n  host_key_policy: accept_new\nnodes: [{name: a}]",
            "inv.yaml:2: defaults.host_key_policy: must be one of strict, accept-new, got string 'accept_new' "
            "(did you mean 'accept-new'?)",
            id="host-key-policy-close",
        ),
        pytest.param(
            "nodes: [{name: a, host_key_policy: no}]",
            "inv.yaml:1: nodes[0].host_key_policy: must be one of strict, accept-new, got boolean no",
            id="host-key-policy-bool",
        ),
        pytest.param(
            "nodes: [{name: a, transport: docker}]",
            "inv.yaml:1: nodes[0].transport: must be one of ssh, local, got string 'docker'",
            id="transport",
        ),
        pytest.param(
            "nodes: []",
            "inv.yaml:1: nodes: must list at least one node (add an entry like '- name: node0')",
            id="empty",
        ),
        pytest.param(
            "nodes: {name: a}",
            "inv.yaml:1: nodes: must be a list of nodes, got a mapping (start each node with '- name: ...')",
            id="nodes-not-list",
        ),
        pytest.param("defaults: {user: root}\n", "inv.yaml:1: missing required key 'nodes'", id="no-nodes"),
        pytest.param(
            "nodes:\n  - name: a\n    hots: b",
            "inv.yaml:3: nodes[0].hots: unknown key (did you mean 'host'?)",
            id="unknown-key-close",
        ),
        pytest.param(
            "nodes: [{name: a}]\nzzz: 1",
            "inv.yaml:2: zzz: unknown key (valid keys: defaults, master, nodes)",
            id="unknown-key-far",
        ),
        pytest.param(
            "defaults: {name: x}\nnodes: [{name: a}]",
            "inv.yaml:1: defaults.name: 'name' cannot have a default (set it on each node under 'nodes')",
            id="name-in-defaults",
        ),
        pytest.param(
            "nodes:\n  - name: a\n    env:\n      FOO: [1]",
            "inv.yaml:4: nodes[0].env.FOO: must be a string, got a list",
            id="env-value-list",
        ),
        pytest.param(
            "nodes:\n  - name: a\n    env:\n      FOO:",
            "inv.yaml:4: nodes[0].env.FOO: must be a string, got null",
            id="env-value-null",
        ),
        pytest.param(
            "nodes:\n  - name: a\n    env:\n      2FOO: x",
            "inv.yaml:4: nodes[0].env.2FOO: not a valid environment variable name "
            "(use letters, digits and '_', not starting with a digit)",
            id="env-name",
        ),
        pytest.param(
            "nodes:\n  - name: a\n    labels: h100",
            "inv.yaml:3: nodes[0].labels: must be a list, got string 'h100' (write [a, b] or one '- item' a line)",
            id="labels-not-list",
        ),
        pytest.param(
            "nodes:\n  - name: 'node 0'",
            "inv.yaml:2: nodes[0].name: invalid node name 'node 0' "
            "(names appear in --nodes and in log file names: use letters, digits, '.', '_' and '-')",
            id="node-name-with-space",
        ),
        pytest.param(
            "- name: a\n",
            "inv.yaml:1: the top level must be a mapping of keys, got a list "
            "(an inventory needs a 'nodes' list, e.g. 'nodes: [{name: node0, host: 10.0.0.10}]')",
            id="top-level-list",
        ),
        pytest.param(
            "# only a comment\n",
            "inv.yaml:1: the file is empty "
            "(an inventory needs a 'nodes' list, e.g. 'nodes: [{name: node0, host: 10.0.0.10}]')",
            id="empty-file",
        ),
        pytest.param(
            "nodes:\n  - name: a\n  - name: a\n    name: b",
            "inv.yaml:4: nodes[1].name: duplicate key (first set at line 3) (remove one of them)",
            id="duplicate-yaml-key",
        ),
        pytest.param(
            "nodes:\n\t- name: a",
            "inv.yaml:2: invalid YAML: while scanning for the next token, found character '\\t' that cannot "
            "start any token (indent with spaces; YAML does not allow tabs)",
            id="tab",
        ),
    ],
)
def test_mistake_is_reported_as_one_line_with_file_line_key_and_hint(text: str, expected: str) -> None:
    assert error(text) == expected


def test_empty_host_is_refused() -> None:
    assert error("nodes:\n  - name: a\n    host: ''") == (
        "inv.yaml:3: nodes[0].host: must not be empty (remove the key to use the default)"
    )


def test_secret_reference_in_inventory_env_is_refused() -> None:
    assert error('nodes:\n  - name: a\n    env:\n      TOKEN: "${env:TOKEN}"') == (
        "inv.yaml:4: nodes[0].env.TOKEN: an inventory cannot hold ${env:...} secrets "
        "(secrets are read from the job file's env, which keeps them out of records)"
    )
