"""Transports that wrap another take every argument the port names.

The runtime awaits every call on its port, :class:`leaseq.worker.transport.Transport`;
a wrapper (the worker's metrics, the chaos harness's recorder) that spells a
method out must accept each of that method's parameters, by name or through
``**kwargs``, and be awaited as the port's is, or the runtime's call fails in
the wrapper, not in the queue. (A
keyword added to the port, such as ``release(..., started=False)``, once met a
wrapper that did not pass it on.)
"""

from __future__ import annotations

import inspect

import pytest

from leaseq.observability.metrics import MeteredTransport
from leaseq.worker.transport import Transport

WRAPPERS = [MeteredTransport]
try:
    from leaseq_chaos.worker_process import RecordingTransport
except ImportError:  # pragma: no cover - the chaos harness is installed beside the package
    pass
else:
    WRAPPERS.append(RecordingTransport)


def _port_methods() -> list[str]:
    return [name for name, member in vars(Transport).items()
            if inspect.isfunction(member) and not name.startswith("_")]


@pytest.mark.parametrize("wrapper", WRAPPERS, ids=lambda cls: cls.__name__)
def test_each_spelled_out_method_takes_every_parameter_of_the_port(wrapper: type) -> None:
    checked = 0
    for name in _port_methods():
        own = wrapper.__dict__.get(name)
        if own is None:  # forwarded as it is (__getattr__): nothing to check
            continue
        checked += 1
        assert inspect.iscoroutinefunction(own), f"{wrapper.__name__}.{name} is not awaited as the port's is"
        port = inspect.signature(getattr(Transport, name)).parameters
        mine = inspect.signature(own).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in mine.values())
        missing = [p for p in port if p != "self" and p not in mine
                   and not (takes_any and port[p].kind in (port[p].KEYWORD_ONLY, port[p].POSITIONAL_OR_KEYWORD))]
        assert not missing, f"{wrapper.__name__}.{name} does not take {missing}"
    assert checked, f"{wrapper.__name__} spells out none of the port's methods"
