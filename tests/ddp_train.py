"""Two-process DDP training on CPU (gloo), run by tests/test_train.py as a script.

Lightning relaunches this script once per extra rank. Every rank records the dataset
positions of the structures it trained on and a checksum of its final weights in
``<out>/rank<k>.json``.

    python tests/ddp_train.py CONFIG.yaml
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import lightning as L

from matris.train import TrainConfig, fit


class Record(L.Callback):
    def __init__(self, out_dir: Path):
        self.out_dir, self.seen = out_dir, []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.extend(int(i) for i in batch.indices)

    def on_train_end(self, trainer, pl_module):
        digest = hashlib.sha256()
        for p in pl_module.model.parameters():
            digest.update(p.detach().cpu().numpy().tobytes())
        record = {"rank": trainer.global_rank, "world_size": trainer.world_size, "seen": self.seen,
                  "weights": digest.hexdigest(), "steps": trainer.global_step}
        (self.out_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    config = TrainConfig.from_yaml(sys.argv[1])
    out = Path(config.trainer.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fit(config, callbacks=[Record(out)])
