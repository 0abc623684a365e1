"""The former name of :mod:`leaseq.core.checks` (input checks, not the recovery
policy, which lives in SQL). Kept so existing imports keep working: this
module *is* ``leaseq.core.checks``."""

import sys

from . import checks

sys.modules[__name__] = checks
