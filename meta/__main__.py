"""``python -m fs3.meta``: the same as ``fs3 meta``."""

import sys

from fs3.meta.main import main

sys.exit(main(sys.argv[1:]))
