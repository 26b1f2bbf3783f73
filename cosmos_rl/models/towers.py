"""The two towers of a Cosmos3 decoder layer, by module path, for LoRA targets and text-tower reuse.

Cosmos3's transformer is a mixture of two towers sharing one sequence: the *understanding* (text)
tower, which attends causally over the prompt's tokens only, and the *generation* tower, whose
vision tokens also attend to the text tower's keys and values. Both towers have an MLP with the
same leaf names (`gate_proj`, `up_proj`, `down_proj`), so peft's suffix match of a leaf name hits
both; a tower name is therefore matched against the full module path.

Pure (standard library only): preflight and `plan` read it without importing torch.
"""

from __future__ import annotations

import re

# Module paths below one decoder layer (`layers.<i>.`), per tower.
TOWERS: dict[str, tuple[str, ...]] = {
    "generation": ("self_attn.add_q_proj", "self_attn.add_k_proj", "self_attn.add_v_proj", "self_attn.to_add_out"),
    "generation_mlp": ("mlp_moe_gen.gate_proj", "mlp_moe_gen.up_proj", "mlp_moe_gen.down_proj"),
    "understanding": (
        "self_attn.to_q", "self_attn.to_k", "self_attn.to_v", "self_attn.to_out",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
    ),
}  # fmt: skip

# What an empty `model.lora.target_modules` means: attention projections of both pathways and both
# MLPs of every decoder layer (peft's suffix match of the MLP names hits both towers' MLPs).
DEFAULT_TARGET_MODULES = (
    "to_q", "to_k", "to_v", "to_out",
    "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
    "gate_proj", "up_proj", "down_proj",
)  # fmt: skip

# A plain target: a module name or dotted path, as peft matches it (the name or a `.`-suffix of a path).
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*")

# Parameters whose values shape the text tower's per-layer keys and values: the token embedding
# and, in every layer, the text pathway's norms, projections and MLP (`to_out` and `mlp` feed the
# next layer's text stream). The final text norm is left out: no vision output reads it.
UNDERSTANDING_PARAMS = re.compile(
    r"(^|\.)(embed_tokens|layers\.\d+\.(input_layernorm|post_attention_layernorm|mlp"
    r"|self_attn\.(to_q|to_k|to_v|to_out|norm_q|norm_k|k_norm_und_for_gen)))\."
)


def target_problem(name: object) -> str | None:
    """Why `name` cannot be a `model.lora.target_modules` entry (None: it can)."""
    if not isinstance(name, str) or not name:
        return "an empty name"
    if name in TOWERS:
        return None
    if not _PLAIN.fullmatch(name):
        return f"{name!r} is neither a tower name ({', '.join(TOWERS)}) nor a module name (letters, digits, _ and .)"
    return None


def peft_targets(names: list[str]) -> list[str] | str:
    """What peft's `LoraConfig.target_modules` gets: the names as given when none is a tower name
    (peft's suffix match, as before tower names existed), else one regular expression that peft
    matches against every full module path: tower names by their paths, plain names as suffixes."""
    if not any(name in TOWERS for name in names):
        return list(names)
    alternatives = []
    for name in names:
        if name in TOWERS:
            alternatives += [r"layers\.\d+\." + re.escape(path) for path in TOWERS[name]]
        else:
            alternatives.append(r"(.*\.)?" + re.escape(name))
    return "(" + "|".join(f"(?:{alternative})" for alternative in alternatives) + ")"


def adapts_text_tower(names: list[str]) -> list[str]:
    """The entries of `names` that put an adapter on the understanding (text) tower of a Cosmos3
    transformer: the tower name itself, or a plain name that is a suffix of one of its module paths."""
    hits = []
    for name in names:
        if name == "understanding":
            hits.append(name)
        elif name not in TOWERS:
            paths = [f"layers.0.{path}" for path in TOWERS["understanding"]]
            bare = re.sub(r"^(.*\.)?layers\.\d+\.", "layers.0.", name)
            if any(path == bare or path.endswith("." + bare) for path in paths):
                hits.append(name)
    return hits
