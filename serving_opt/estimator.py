"""Public path of the Estimator integration: ``serving_opt.estimator.OptimizingExporter``.

The code lives in :mod:`serving_opt.integrations.estimator`; this name is the same
module object, so patching or logging through either path is the same thing.
"""

import sys

from serving_opt.integrations import estimator as _impl

sys.modules[__name__] = _impl
