"""The environment of a child process that reads a model folder or file (llama.cpp's converter, quantizer and
server): what it needs to run, and none of the serving user's secrets.

The serving user holds the registry's database URL and credentials. A child that parses files a trainer wrote
gets only an allow-list: PATH, the locale, the offline switches, thread counts, and a fresh empty HOME (no
dotfiles, caches or credentials of ours), plus what the caller adds (the converter's PYTHONPATH). A name that
looks like a secret never passes, even when the allow-list would take it.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

PASSED = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "TMPDIR", "LD_LIBRARY_PATH", "OMP_NUM_THREADS",
                    "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"})
PASSED_PREFIXES = ("LC_",)
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
SECRET = re.compile(r"PASS|TOKEN|KEY|SECRET|CREDENTIAL|AUTH|COOKIE|SESSION|DATABASE|_DB$|_DSN$|_URI$|_URL$",
                    re.IGNORECASE)
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


def child_env(home: Path | str, extra: Mapping[str, str] | None = None,
              parent: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment for the child: the allow-listed part of `parent` (default `os.environ`), the
    offline switches, HOME=`home`, then `extra` (the caller's own settings)."""
    parent = os.environ if parent is None else parent
    env = {k: v for k, v in parent.items() if _passes(k)}
    env.setdefault("PATH", DEFAULT_PATH)
    env.update(OFFLINE)
    home = str(home)
    env.update({"HOME": home, "XDG_CACHE_HOME": str(Path(home) / ".cache"),
                "XDG_CONFIG_HOME": str(Path(home) / ".config")})
    env.update(extra or {})
    return env


def _passes(name: str) -> bool:
    if SECRET.search(name):
        return False
    return name in PASSED or name.startswith(PASSED_PREFIXES)


def new_home(prefix: str = "mlops-child-home-") -> Path:
    """A fresh, empty, private folder to be a child's HOME; the caller removes it (`remove_home`)."""
    return Path(tempfile.mkdtemp(prefix=prefix))  # mode 0700


def remove_home(home: Path | str) -> None:
    shutil.rmtree(home, ignore_errors=True)


@contextmanager
def child_home(prefix: str = "mlops-child-home-") -> Iterator[Path]:
    """A fresh HOME for one child run, removed when it ends."""
    home = new_home(prefix)
    try:
        yield home
    finally:
        remove_home(home)
