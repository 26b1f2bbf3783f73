"""What preflight and `plan` read of a diffusers pipeline folder, without any weights (no torch)."""

from __future__ import annotations

import json
from pathlib import Path


def stub_model_folder(root: Path, **scheduler) -> Path:
    """model_index.json, an empty transformer/ and a flow-UniPC scheduler config (`scheduler` on top)."""
    (root / "transformer").mkdir(parents=True)
    (root / "scheduler").mkdir()
    (root / "model_index.json").write_text('{"_class_name": "Cosmos3OmniPipeline"}')
    config = {"_class_name": "UniPCMultistepScheduler", "use_flow_sigmas": True, "prediction_type": "flow_prediction", **scheduler}
    (root / "scheduler" / "scheduler_config.json").write_text(json.dumps(config))
    return root
