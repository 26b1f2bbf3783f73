"""VideoAlign (VideoReward): a Qwen2-VL-2B video reward model scoring visual quality (VQ), motion
quality (MQ) and text alignment (TA) separately, read from a local folder.

How the released model works (KwaiVGI/VideoAlign, `inference.py`, `prompt_template.py`; read, not
copied): the policy model is Qwen2-VL-2B-Instruct fine-tuned with LoRA, plus a reward head `rm_head`,
a bias-free Linear from the language model's hidden width to ONE output. The tokenizer gains three
special tokens, `<|VQ_reward|>`, `<|MQ_reward|>`, `<|TA_reward|>`, and the prompt (template
`detailed_special`) describes the three criteria and places one reward token after each criterion's
paragraph, the generation prompt inside the TA paragraph. The video enters as one user turn (the
video, then that text) in Qwen2-VL's chat format with the generation prompt. One forward pass; the
head applied to the last hidden state at the three reward tokens gives the raw VQ, MQ and TA, in
token order. With the release's `inference_config` (means and stds of each dimension over its
training data) each is standardised, (raw - mean) / std, and the Overall score is VQ + MQ + TA.
The release samples a video file at `data_config.fps` (2) frames per second, each frame resized
to at most `data_config.max_frame_pixels` (448 x 448 = 200704) pixels.

The folder this module reads (nothing is downloaded; weights from safetensors only):
    config.json, *.safetensors   a Qwen2VLForConditionalGeneration (`save_pretrained`) whose weights
                                 also hold `rm_head.weight` [1, hidden] (in any of the .safetensors
                                 files): the LoRA already MERGED into the base weights
    tokenizer files              the Qwen2 tokenizer with the three reward tokens added
    model_config.json            the release's own settings file, read as JSON: `data_config`
                                 (`max_frame_pixels`, optional `min_frame_pixels`),
                                 `inference_config` (the means/stds; absent: raw scores)
    prompt_template.txt          the `detailed_special` template's text (the release's
                                 prompt_template.py), `{text_prompt}` where the prompt goes
The release ships the LoRA adapter and pickled `.pth` state dicts, which are never loaded here;
merge once with the release's own loader and save (docs/rewards.md, "VideoAlign").

Frames: the tool's clips are short arrays with no source file, so every frame is scored (no fps
resampling); an odd frame count repeats the last frame, as Qwen2-VL's video processor does. The
video preprocessing is done here without torchvision (`video_patches`): each frame is resized with
PIL bicubic to Qwen2-VL's pixel budget (sides multiples of 28 = patch 14 x merge 2, pixels within
[min, max]), scaled to [0, 1], normalised with the CLIP mean/std, and cut into patches of 2 frames x
14 x 14 in the 2x2-merge order Qwen2-VL's vision tower reads (`pixel_values_videos`,
`video_grid_thw`). The release resizes with torchvision's antialiased bicubic, so pixels may differ
from it in the last bits.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cosmos_rl.checkpoint.weight_files import FolderProblem, read_safetensors_header
from cosmos_rl.core.errors import UserError, library_text

KIND = "videoalign"
DIMENSIONS = ("vq", "mq", "ta")  # the score's dimensions, in reward-token order
REWARD_TOKENS = ("<|VQ_reward|>", "<|MQ_reward|>", "<|TA_reward|>")
HEAD_KEY = "rm_head.weight"
SETTINGS_FILE = "model_config.json"
TEMPLATE_FILE = "prompt_template.txt"
PROMPT_SLOT = "{text_prompt}"
# Qwen2-VL's vision geometry and normalisation (its processor's defaults; the release keeps them).
PATCH, MERGE, TEMPORAL = 14, 2, 2
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# The release's per-frame pixel budget (data_config.max_frame_pixels) and Qwen2-VL's video minimum.
MAX_FRAME_PIXELS = 448 * 448
MIN_FRAME_PIXELS = 128 * 28 * 28
SYSTEM = "You are a helpful assistant."  # Qwen2-VL's default system turn, which its chat format adds


# ------------------------------------------------------------------------------ video input
def frame_size(height: int, width: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The size a frame is resized to: sides multiples of 28, about the same aspect, pixels in budget."""
    factor = PATCH * MERGE
    h, w = max(factor, round(height / factor) * factor), max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        scale = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / scale / factor) * factor)
        w = max(factor, math.floor(width / scale / factor) * factor)
    elif h * w < min_pixels:
        scale = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * scale / factor) * factor, math.ceil(width * scale / factor) * factor
    return h, w


def video_patches(clip: np.ndarray, min_pixels: int = MIN_FRAME_PIXELS, max_pixels: int = MAX_FRAME_PIXELS):
    """uint8 clip [F, H, W, 3] -> (patches float32 [t * gh * gw, 3 * 2 * 14 * 14], (t, gh, gw)).

    Row order: time step, then 2x2 merge block (row-major), then the patch within the block; each row
    holds channel, frame of the pair, patch row, patch column (Qwen2-VL's `pixel_values_videos`)."""
    from PIL import Image

    f, height, width = clip.shape[:3]
    h, w = frame_size(height, width, min_pixels, max_pixels)
    frames = [np.asarray(Image.fromarray(frame).resize((w, h), Image.BICUBIC)) if (h, w) != (height, width) else frame
              for frame in clip]  # fmt: skip
    if len(frames) % TEMPORAL:
        frames.append(frames[-1])  # an odd count: the last frame again, as Qwen2-VL's video processor does
    x = np.stack(frames).astype(np.float32) / 255.0  # [F', h, w, 3]
    x = (x - np.asarray(CLIP_MEAN, np.float32)) / np.asarray(CLIP_STD, np.float32)
    t, gh, gw = len(frames) // TEMPORAL, h // PATCH, w // PATCH
    x = x.transpose(0, 3, 1, 2).reshape(t, TEMPORAL, 3, gh // MERGE, MERGE, PATCH, gw // MERGE, MERGE, PATCH)
    # -> [t, block row, block col, merge row, merge col, channel, frame of pair, patch row, patch col]
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(x.reshape(t * gh * gw, 3 * TEMPORAL * PATCH * PATCH)), (t, gh, gw)


def chat_text(body: str, video_tokens: int, video_pad: str = "<|video_pad|>") -> str:
    """Qwen2-VL's chat format for one user turn holding the video, then `body`, with the generation prompt."""
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n<|vision_start|>{video_pad * video_tokens}"
            f"<|vision_end|>{body}<|im_end|>\n<|im_start|>assistant\n")  # fmt: skip


# ------------------------------------------------------------------------------ the folder
def _fail(option: str, folder: Path, what: str) -> UserError:
    return UserError(f"{option} {KIND}={folder}: {what}")


def read_settings(folder: Path, option: str = "--model") -> dict:
    """{min_pixels, max_pixels, means, stds} from the release's model_config.json (plain JSON)."""
    path = folder / SETTINGS_FILE
    fix = f"copy {SETTINGS_FILE} from the released VideoReward folder beside the merged weights"
    if not path.is_file():
        raise _fail(option, folder, f"no {SETTINGS_FILE} (the release's settings: frame pixels, score normalisation); {fix}")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _fail(option, folder, f"{SETTINGS_FILE} is not JSON ({library_text(exc)}); {fix}") from None
    data = raw.get("data_config") if isinstance(raw, dict) else None
    if not isinstance(data, dict):
        raise _fail(option, folder, f"{SETTINGS_FILE} has no data_config table; {fix}")
    out = {}
    for key, name, default in (("max_pixels", "max_frame_pixels", MAX_FRAME_PIXELS), ("min_pixels", "min_frame_pixels", MIN_FRAME_PIXELS)):
        value = data.get(name, default)
        if not (isinstance(value, int) and not isinstance(value, bool) and 784 <= value <= 4096 * 4096):
            raise _fail(option, folder, f"{SETTINGS_FILE} data_config.{name} is {value!r}; give a whole number of pixels "
                                        f"from 784 (28 x 28) to {4096 * 4096}")  # fmt: skip
        out[key] = value
    if out["min_pixels"] > out["max_pixels"]:
        raise _fail(option, folder, f"{SETTINGS_FILE} data_config.min_frame_pixels {out['min_pixels']} is over "
                                    f"max_frame_pixels {out['max_pixels']}; make min <= max")  # fmt: skip
    norm = raw.get("inference_config")
    out["means"] = out["stds"] = None
    if norm is not None:
        keys = [f"{d.upper()}_{s}" for d in DIMENSIONS for s in ("mean", "std")]
        bad = [k for k in keys if not (isinstance(norm, dict) and isinstance(norm.get(k), (int, float))
                                       and not isinstance(norm.get(k), bool) and math.isfinite(norm[k]))]  # fmt: skip
        if bad or any(norm[f"{d.upper()}_std"] <= 0 for d in DIMENSIONS):
            raise _fail(option, folder, f"{SETTINGS_FILE} inference_config needs finite {', '.join(keys)} with stds > 0 "
                                        f"(bad: {', '.join(bad) or 'a std <= 0'}); fix them or remove inference_config for raw scores")  # fmt: skip
        out["means"] = [float(norm[f"{d.upper()}_mean"]) for d in DIMENSIONS]
        out["stds"] = [float(norm[f"{d.upper()}_std"]) for d in DIMENSIONS]
    return out


def read_template(folder: Path, option: str = "--model") -> str:
    path = folder / TEMPLATE_FILE
    fix = (f"write the release's `detailed_special` template (prompt_template.py, DETAILED_PROMPT_WITH_SPECIAL_TOKEN) "
           f"to {path}")  # fmt: skip
    if not path.is_file():
        raise _fail(option, folder, f"no {TEMPLATE_FILE} (the prompt the model was trained on); {fix}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(option, folder, f"{TEMPLATE_FILE} cannot be read as UTF-8 ({library_text(exc)}); {fix}") from None
    counts = {token: text.count(token) for token in (PROMPT_SLOT, *REWARD_TOKENS)}
    positions = [text.find(token) for token in REWARD_TOKENS]
    if any(n != 1 for n in counts.values()) or positions != sorted(positions):
        raise _fail(option, folder, f"{TEMPLATE_FILE} must hold {PROMPT_SLOT} once and {', '.join(REWARD_TOKENS)} once each "
                                    f"in that order, found counts {counts}; {fix}")  # fmt: skip
    return text


def find_head(folder: Path, hidden: int, option: str = "--model") -> Path:
    """The .safetensors file holding `rm_head.weight`, checked to be [1, hidden]."""
    found = []
    for path in sorted(folder.glob("*.safetensors")):
        try:
            header = read_safetensors_header(path)
        except FolderProblem as exc:
            raise _fail(option, folder, f"{path.name} is not a readable safetensors file ({exc}); re-save the model") from None
        if HEAD_KEY in header:
            found.append((path, header[HEAD_KEY][1]))
    fix = ("merge the release's LoRA and rm_head into the model and save_pretrained(safe_serialization=True) "
           "(docs/rewards.md, VideoAlign)")  # fmt: skip
    if not found:
        raise _fail(option, folder, f"no tensor {HEAD_KEY} in any .safetensors file (the reward head); {fix}")
    if len(found) > 1:
        raise _fail(option, folder, f"{HEAD_KEY} is in {[p.name for p, _ in found]}; keep it in one file")
    path, shape = found[0]
    if tuple(shape) != (1, hidden):
        raise _fail(option, folder, f"{path.name} {HEAD_KEY} has shape {list(shape)}, expected [1, {hidden}] (one score per "
                                    f"reward token from the model's {hidden}-wide hidden state); pair the head with its model")  # fmt: skip
    return path


def check_folder(folder: Path, option: str = "--model") -> dict:
    """The folder's config, judged before the model is built: {hidden, video_token_id}."""
    if not folder.is_dir():
        raise _fail(option, folder, "folder not found; pass a local folder with a merged VideoAlign checkpoint")
    if not any(folder.glob("*.safetensors")):
        raise _fail(option, folder, "no .safetensors weights in the folder (pickled .bin/.pth weights are never loaded); "
                                    "re-save the merged model with save_pretrained(safe_serialization=True)")  # fmt: skip
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _fail(option, folder, f"config.json cannot be read as JSON ({library_text(exc)}); save the model with "
                                    "save_pretrained") from None  # fmt: skip
    if not isinstance(config, dict) or config.get("model_type") != "qwen2_vl":
        found = config.get("model_type") if isinstance(config, dict) else type(config).__name__
        raise _fail(option, folder, f"config.json model_type is {found!r}, not 'qwen2_vl'; VideoAlign is a Qwen2-VL model")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    hidden = text.get("hidden_size", config.get("hidden_size"))
    if not (isinstance(hidden, int) and 1 <= hidden <= 1 << 16):
        raise _fail(option, folder, f"config.json hidden_size is {hidden!r}; expected a positive width")
    video_token_id = config.get("video_token_id", text.get("video_token_id"))
    if not isinstance(video_token_id, int):
        raise _fail(option, folder, f"config.json video_token_id is {video_token_id!r}; save the model with save_pretrained")
    return {"hidden": hidden, "video_token_id": video_token_id}


def _device(device: str):
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class VideoAlignReward:
    """The reward of `reward serve --model videoalign=FOLDER`: clips [N, F, H, W, 3] and their prompts ->
    `Scored` (Overall = VQ + MQ + TA per clip, and each dimension)."""

    dimensions = DIMENSIONS

    def __init__(self, folder: str | Path, device: str = "auto", option: str = "--model"):
        import torch
        from safetensors import safe_open
        from transformers import AutoTokenizer, Qwen2VLForConditionalGeneration
        from transformers.utils import logging as hf_logging

        from cosmos_rl.rewards.models import revision_of

        folder = Path(folder).expanduser().resolve()
        facts = check_folder(folder, option)
        self.settings = read_settings(folder, option)
        self.template = read_template(folder, option)
        head_file = find_head(folder, facts["hidden"], option)
        self.folder, self.device = folder, _device(device)
        hf_logging.set_verbosity_error()  # no progress bars, and no note that rm_head.weight is not the base model's
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        except Exception as exc:  # the library's refusal of tokenizer files
            raise _fail(option, folder, f"the tokenizer does not load ({library_text(exc)}); save the release's processor "
                                        "with save_pretrained into the folder") from None  # fmt: skip
        ids = [self.tokenizer.convert_tokens_to_ids(t) for t in (*REWARD_TOKENS, "<|video_pad|>")]
        unknown = [t for t, i in zip((*REWARD_TOKENS, "<|video_pad|>"), ids) if i is None or i == self.tokenizer.unk_token_id]
        if unknown:
            raise _fail(option, folder, f"the tokenizer has no {', '.join(unknown)} token; save the release's tokenizer "
                                        "(with the reward tokens added) into the folder")  # fmt: skip
        if ids[-1] != facts["video_token_id"]:
            raise _fail(option, folder, f"the tokenizer's <|video_pad|> is id {ids[-1]} but config.json video_token_id is "
                                        f"{facts['video_token_id']}; save the tokenizer and model together")  # fmt: skip
        self.reward_ids, self.video_pad_id = ids[:3], ids[3]
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        try:
            self.model = Qwen2VLForConditionalGeneration.from_pretrained(
                folder, use_safetensors=True, local_files_only=True, dtype=dtype)
        except Exception as exc:  # the library's refusal of a file the checks above let through
            raise _fail(option, folder, f"not a loadable Qwen2-VL checkpoint ({library_text(exc)}); save the merged "
                                        "model with save_pretrained(safe_serialization=True)") from None  # fmt: skip
        self.model.to(self.device).eval()
        with safe_open(str(head_file), framework="pt") as f:
            self.head = f.get_tensor(HEAD_KEY).float().to(self.device)  # [1, hidden]
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.revision = revision_of(KIND, folder)
        self._torch = torch

    def inputs(self, clips: np.ndarray, prompts: Sequence[str]) -> dict:
        """The model's inputs for N clips: right-padded token ids with the mask, video patches, grids,
        and each clip's three reward-token positions [N, 3]."""
        torch = self._torch
        patches, grids, rows = [], [], []
        for clip, prompt in zip(clips, prompts):
            p, grid = video_patches(clip, self.settings["min_pixels"], self.settings["max_pixels"])
            patches.append(p)
            grids.append(grid)
            body = self.template.replace(PROMPT_SLOT, prompt)
            rows.append(self.tokenizer(chat_text(body, p.shape[0] // (MERGE * MERGE)), add_special_tokens=False)["input_ids"])
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        positions = []
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
            where = [[j for j, t in enumerate(row) if t == token] for token in self.reward_ids]
            if any(len(w) != 1 for w in where):
                raise ValueError(f"prompt {prompts[i][:80]!r} makes the reward tokens appear {[len(w) for w in where]} times; "
                                 "a prompt may not contain the reward tokens")  # fmt: skip
            positions.append([w[0] for w in where])
        return {
            "input_ids": ids, "attention_mask": mask, "mm_token_type_ids": (ids == self.video_pad_id).long() * 2,
            "pixel_values_videos": torch.from_numpy(np.concatenate(patches)), "video_grid_thw": torch.tensor(grids),
            "positions": torch.tensor(positions),
        }  # fmt: skip

    def raw_scores(self, clips: np.ndarray, prompts: Sequence[str]):
        """[N, 3] float64: the head at each clip's VQ, MQ and TA tokens, before normalisation."""
        torch = self._torch
        batch = self.inputs(clips, prompts)
        positions = batch.pop("positions")
        batch = {k: v.to(self.device) for k, v in batch.items()}
        batch["pixel_values_videos"] = batch["pixel_values_videos"].to(self.model.dtype)
        with torch.no_grad():
            hidden = self.model.model(**batch).last_hidden_state  # [N, L, hidden]
            picked = hidden[torch.arange(len(prompts), device=self.device)[:, None], positions.to(self.device)]  # [N, 3, hidden]
            return (picked.float() @ self.head.T)[..., 0].double().cpu()

    def __call__(self, clips: np.ndarray, prompts: Sequence[str]):
        from cosmos_rl.rewards.dimensions import Scored
        from cosmos_rl.rewards.video import check_clips

        check_clips(clips, prompts)
        raw = self.raw_scores(clips, prompts)
        if self.settings["means"] is not None:
            raw = (raw - raw.new_tensor(self.settings["means"])) / raw.new_tensor(self.settings["stds"])
        dims = {name: [float(v) for v in raw[:, k]] for k, name in enumerate(DIMENSIONS)}
        return Scored([float(v) for v in raw.sum(dim=1)], dims)
