"""Lets the tests here import their shared helper module (synthetic_runs)."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
