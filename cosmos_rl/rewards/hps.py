"""HPSv2.1 (Human Preference Score v2.1) as a CLIP folder: its constants and HPSv2's own image
preprocessing; the one-time conversion of the released checkpoint is `rewards.hps_convert`.

The release (`HPS_v2.1_compressed.pt`, tgxs002/HPSv2) is a torch pickle of an open_clip ViT-H-14
state dict nested under `state_dict`. open_clip is not used to load it: its package import pulls
in torchvision, which does not install beside the CPU torch wheel this project pins. ViT-H-14 is a
standard CLIP (pre-norm transformer blocks, class-token vision pooling, causal text tower pooled
at the end-of-text token), so `convert_hps` renames its tensors to transformers' `CLIPModel`
(splitting each fused attention `in_proj` into q/k/v, transposing the two projections) and writes a
`save_pretrained`-style folder that `ClipRewardModel("hps", FOLDER)` loads like every CLIP reward
(`rewards.hps_convert.convert_hps`, `cosmos-rl reward convert-hps`).

The score, as HPSv2's `score` computes it: the cosine of the normalised image and text embeddings
(`image_features @ text_features.T` of unit vectors; no logit scale), typically 0.2 to 0.35.
Images are preprocessed as HPSv2's validation transform does, not as CLIP's processor does: the
longer side resized to the model's side (bicubic), the shorter side padded with black on both
sides to a square (no crop, so nothing of a wide frame is cut off), then OpenAI CLIP mean/std.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# open_clip ViT-H-14's head counts (vision width 1280 / head width 80, text width 1024 / 64): a
# state dict's shapes do not say how a width splits into heads, so the converter is told.
VIT_H_14_HEADS = {"vision": 16, "text": 16}
# The mean/std HPSv2 normalises with (open_clip's OPENAI_DATASET_MEAN/STD: the laion2B ViT-H-14
# it starts from declares none of its own).
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


# ------------------------------------------------------------------------------ preprocessing
def hps_pixels(images: np.ndarray, side: int, mean: Sequence[float], std: Sequence[float]):
    """uint8 [N, H, W, 3] -> float32 [N, 3, side, side]: HPSv2's validation transform.

    The longer side is resized to `side` (PIL bicubic, the aspect kept, sides rounded), the image is
    centred on a black `side` x `side` square (the odd pixel of padding goes right/bottom), scaled
    to [0, 1] and normalised by `mean`/`std`. An image whose longer side already is `side` is not
    resized, only padded.
    """
    import torch
    from PIL import Image

    out = np.zeros((len(images), side, side, 3), dtype=np.float32)
    for i, image in enumerate(images):
        height, width = image.shape[:2]
        scale = side / max(height, width)
        new_h, new_w = (round(height * scale), round(width * scale)) if scale != 1.0 else (height, width)
        picture = Image.fromarray(np.ascontiguousarray(image))  # uint8 [H, W, 3]: RGB
        if (new_h, new_w) != (height, width):
            picture = picture.resize((new_w, new_h), Image.Resampling.BICUBIC)
        top, left = (side - new_h) // 2, (side - new_w) // 2
        out[i, top : top + new_h, left : left + new_w] = np.asarray(picture, dtype=np.float32) / 255.0
    out = (out - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)
    return torch.from_numpy(out).permute(0, 3, 1, 2).contiguous()
