"""``python -m leaseq.cli``: the same as the ``leaseq`` command."""

from .main import main

main()
