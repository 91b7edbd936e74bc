"""``python -m serving_opt.sandbox PRELOAD RESULT``: the process inside bubblewrap that runs
one call and writes its result (:func:`serving_opt.sandbox._serve`)."""

import sys

from serving_opt.sandbox import _serve
from serving_opt.savedmodel import tf_process

if __name__ == "__main__":
    tf_process.keep_plotting_out()
    sys.exit(_serve(sys.argv[1], sys.argv[2]))
