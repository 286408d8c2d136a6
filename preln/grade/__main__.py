"""python -m preln.grade SUBMISSIONS [--jobs N] [--out DIR] ...: see preln/grade/cli.py (or --help)."""
import sys

from .cli import main

sys.exit(main())
