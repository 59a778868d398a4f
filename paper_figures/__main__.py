import sys

from paper_figures.cli import main

if __name__ == "__main__":
    sys.exit(main())
