"""`find_hf_folder`: where the HF model folder (the one holding config.json) sits inside a downloaded model tree.

It sits low, importing nothing of the project, because both the model refs (mlops.model_refs) and the pyfunc
wrapper that tracking logs models with (mlops.hf_pyfunc) need it, and the refs read the tracking store.
"""

from __future__ import annotations

from pathlib import Path


def find_hf_folder(root: Path, depth: int = 3) -> Path:
    """The HF folder inside a downloaded model tree (the pyfunc layout puts it under artifacts/)."""
    root = Path(root)
    if (root / "config.json").exists():
        return root
    for candidate in [*sorted((root / "artifacts").glob("*/")), root / "hf"]:
        if (candidate / "config.json").exists():
            return candidate
    if depth > 0 and root.is_dir():
        for child in sorted(p for p in root.iterdir() if p.is_dir()):
            try:
                return find_hf_folder(child, depth - 1)
            except FileNotFoundError:
                continue
    raise FileNotFoundError(f"no HF model folder (config.json) inside {root}")
