"""The environment switch: ``KAGENT_GOVERNED_MEMORY=on`` installs governed memory at interpreter start.

``kagent_memory_governed.pth`` calls ``activate_from_environment`` (and only imports this module when the
switch is set), so the stock ``kagent-adk static`` of a Declarative Agent image runs governed. What is
installed, and how, is ``adk.runtime``. Activation that was asked for and fails ends the process with a
content-free message and status 78; it never falls back to upstream memory.
"""

from __future__ import annotations

import os
import sys

from kagent_memory_governed.errors import ConfigurationError
from kagent_memory_governed.mode import load, refuse_in_process_in_pod
from kagent_memory_governed.settings import SWITCH

ENVIRONMENT_SWITCH = SWITCH
EXIT_ACTIVATION_FAILED = 78  # EX_CONFIG


def activate_from_environment() -> None:
    """With ``KAGENT_GOVERNED_MEMORY=on``, install or end the process with a content-free message and a
    non-zero status; unset or ``off``, do nothing."""
    switch = os.environ.get(ENVIRONMENT_SWITCH, "").strip().lower()
    if switch in ("", "off"):
        return
    try:
        if switch != "on":
            raise ConfigurationError(f"{ENVIRONMENT_SWITCH} must be 'on' or 'off'")
        settings = load()
        settings.trust()  # a configuration error ends the process before kagent-adk is even imported
        refuse_in_process_in_pod(settings)
        from kagent_memory_governed.adk.runtime import install

        install(settings=settings)
    except Exception as error:
        detail = str(error) if isinstance(error, ConfigurationError) else type(error).__name__
        sys.stderr.write(f"kagent-memory-governed: activation failed: {detail}\n")
        sys.stderr.flush()
        os._exit(EXIT_ACTIVATION_FAILED)
