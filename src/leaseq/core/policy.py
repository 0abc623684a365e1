"""The former name of :mod:`leaseq.core.checks` (input checks, not the recovery
policy, which lives in SQL). Kept so existing imports keep working: this
module *is* ``leaseq.core.checks``."""

import sys
from typing import TYPE_CHECKING

from . import checks

if TYPE_CHECKING:  # what type checkers see: the same names as leaseq.core.checks
    from .checks import *  # noqa: F403

sys.modules[__name__] = checks
