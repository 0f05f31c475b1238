import sys

from .cli import main

if __name__ == "__main__":  # engines spawn processes that re-import __main__
    sys.exit(main())
