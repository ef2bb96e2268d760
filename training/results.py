"""What a finished training run leaves behind: `TrainResult` (what `train` returns) and `FINAL`, the name of
the file a finished run writes into its checkpoint folder.

They sit low, importing no other training module, because every layer needs them: `prepare` reads FINAL to
spot a config that already trained, `runs` rebuilds a TrainResult from it, and `final` and `trainer` write both.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

FINAL = "final.json"


@dataclass
class TrainResult:
    run_id: str
    status: str  # FINISHED, FAILED or STOPPED
    steps: int
    metrics: dict = field(default_factory=dict)  # loss, val_loss, val_perplexity, tokens_seen, ...
    model_dir: Path | None = None
    model_uri: str | None = None
    checkpoint: Path | None = None
    stopped: bool = False
    reason: str | None = None

    def as_dict(self) -> dict:
        d = asdict(self)
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items()}
