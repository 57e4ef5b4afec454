"""The local backend: this machine only, through the local transport, whatever inventory is set."""

from __future__ import annotations

from orchestrator.backends.ssh import SshBackend
from orchestrator.errors import UsageError
from orchestrator.spec import Inventory, default_inventory


class LocalBackend(SshBackend):
    """The SSH backend's machinery on the built-in inventory: one host, `localhost`, no SSH."""

    NAME = "local"
    DESCRIPTION = "this machine only (the built-in inventory), whatever -i or $DISTRUN_INVENTORY say"

    def inventory(self, path: str | None) -> Inventory:
        """The built-in inventory; an inventory given with -i (`path`) would be ignored, so it is refused.

        Raises:
            UsageError: -i was given.
        """
        if path:
            raise UsageError(f"--backend local runs on this machine only, so -i {path} would be "
                             "ignored (drop -i, or use --backend ssh to run on that inventory's hosts)")
        return default_inventory()
