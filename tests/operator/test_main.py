"""Entry point arguments: what `automq operator` passes must make sense to run_operator."""

from __future__ import annotations

import inspect

import pytest

from automq.operator.main import operate, run_operator


async def test_operate_needs_namespaces_or_clusterwide() -> None:
    with pytest.raises(ValueError, match="namespaces to watch, or clusterwide"):
        await operate([], clusterwide=False)


def test_run_operator_takes_what_the_cli_passes() -> None:
    # broker/cli.py calls run_operator(namespaces=..., clusterwide=..., liveness=...)
    params = inspect.signature(run_operator).parameters
    assert {"namespaces", "clusterwide", "liveness"} <= set(params)
    assert all(params[name].default is inspect.Parameter.empty for name in ("namespaces", "clusterwide", "liveness"))
