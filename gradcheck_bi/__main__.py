"""``python -m gradcheck_bi``: the same entry point as the ``gradcheck-bi`` command."""

import sys

from gradcheck_bi.cli import main

if __name__ == "__main__":
    sys.exit(main())
