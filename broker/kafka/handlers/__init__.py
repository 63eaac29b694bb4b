"""Request handlers, one module per family of Kafka APIs. Importing this package registers them.

Handler modules owned by other parts of the Kafka layer (groups, producers, admin) are imported
when present, so the server runs with whatever is implemented; a module that exists but fails
to import is a real error and is not swallowed.
"""

from __future__ import annotations

import importlib

from automq.broker.kafka.handlers.registry import handles, lookup, registrations

_HANDLER_MODULES = (
    "api_versions",
    "metadata",
    "produce",
    "fetch",
    "list_offsets",
    "groups",  # FindCoordinator and the group APIs
    "producers",  # InitProducerId
    "admin",  # topics, configs, records, cluster, reassignments
)


def _import_handlers() -> None:
    for name in _HANDLER_MODULES:
        module = f"{__name__}.{name}"
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise


_import_handlers()

__all__ = ("handles", "lookup", "registrations")
