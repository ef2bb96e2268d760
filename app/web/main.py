"""Streamlit entry script of the release-approval app (`mlops app` runs it; see app/shell.py)."""

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # the app's own code wins over any other install of the project
    sys.path.insert(0, ROOT)

from app.shell import run  # noqa: E402

run()
