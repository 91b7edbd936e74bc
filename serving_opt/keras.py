"""Public path of the Keras integration: ``import serving_opt.keras``.

The code lives in :mod:`serving_opt.integrations.keras_export`; this name is the same
module object, so patching or logging through either path is the same thing.
"""

import sys

from serving_opt.integrations import keras_export as _impl

sys.modules[__name__] = _impl
