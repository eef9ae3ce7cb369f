"""``python -m gradcheck_bi``: the same entry point as the ``gradcheck-bi`` command."""

import sys

try:
    from gradcheck_bi.cli import main
except KeyboardInterrupt:  # Ctrl-C while the command line itself is being imported
    sys.stderr.write("gradcheck-bi: interrupted; nothing was run\n")
    sys.exit(130)

if __name__ == "__main__":
    sys.exit(main())
