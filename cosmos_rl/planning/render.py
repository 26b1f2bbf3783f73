"""Rich rendering of a resolved plan (the dict ``plan.build`` returns).

Values hold outside text (paths, URLs, the launch line), so they are ``Text`` objects, which rich
never parses as markup: brackets in ``job.output_dir`` print as written.
"""

from __future__ import annotations

import shlex

from rich.console import Console
from rich.table import Table
from rich.text import Text


def _value(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={_value(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(_value(v) for v in value)
    return str(value)


def _base(base: dict) -> str:
    given = f"rl.init_from = {base['init_from']!r}" if base["init_from"] else "rl.init_from unset"
    skip = ", ".join(base["skip_patterns"]) or "none"
    return f"{base['resolved']}  <- {given}; skipping keys: {skip}"


def _media(media: dict) -> str:
    what = f"{media['frames']}-frame clips at {media['fps']:g} fps ({media['seconds']:g} s)" if media["kind"] == "video" else "images"
    text = f"{what}, {media['size'][0]}x{media['size'][1]} px"
    if "latent" in media:
        text += (f"; latents {'x'.join(map(str, media['latent']))}, {media['vision_tokens_per_sample']} vision tokens per sample; "
                 f"activations about {media['activation_mib_per_sample']} MiB per sample ({media['activation_estimate']})")
    return text


_TERMS = ("weights", "adapters", "reference", "gradients", "optimizer", "gathered_weights", "vae_weights", "vae_decode",
          "train_activations", "backward_transient", "sample_activations")


def _memory(memory: dict) -> list[tuple[str, str]]:
    t = memory["terms_gib"]
    terms = ", ".join(f"{k.replace('_', ' ')} {t[k]:g}" for k in _TERMS if t[k])
    text = (f"peak {t['peak']:g} GiB = max(sampling {t['sampling']:g}, training {t['training']:g}); "
            f"GiB over {memory['shards']} FSDP2 shard(s): {terms}. {memory['estimate']}")
    rows = [("memory per rank", text)]
    layouts = "; ".join(
        f"cp {r['context_parallel']}{' + ckpt' if r['gradient_checkpointing'] else ''} ({r['ranks']} ranks): {r['peak_gib']:g}"
        for r in memory["by_layout"]
    )
    rows.append(("peak by layout (GiB)", layouts))
    return rows


def render_plan(console: Console, plan: dict) -> None:
    title = Text(f"cosmos-rl plan: {plan['algorithm'].upper()} run {plan['run_dir']}", style="table.title")
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("what", style="bold cyan", no_wrap=True)
    table.add_column("value", overflow="fold")
    rows = [
        ("backend", f"{plan['backend']} (grouping {plan['grouping']}, placement {plan['gpu_placement']})"),
        ("world size", f"{plan['world_size']}  <- {plan['world_size_from']}"),
        ("nodes / device", f"{plan['nodes']} / {plan['device']} ({plan['dtype']})"),
        ("model", f"{plan['model']}, {plan['fine_tune']} fine-tune"),
        ("text-tower reuse", plan["text_tower_reuse"]),
        ("base weights", _base(plan["base"])),
    ]
    if "shapes" in plan:
        rows.append(("role shapes", _value(plan["shapes"])))
    if "roles" in plan:  # online: the spec's five roles, each with the code that plays it
        rows.append(("roles per process", "; ".join(f"{role}: {who}" for role, who in plan["roles"].items())))
    else:
        rows.append(("roles per process", _value(plan["roles_per_process"])))
    rows.append(("per step", _value(plan["per_step"])))
    if "media" in plan:
        rows.append(("media", _media(plan["media"])))
    if "context_parallel" in plan:
        cp = plan["context_parallel"]
        rows.append(("context parallel", "; ".join([cp["summary"], *(f"{k.replace('_', ' ')} {v}" for k, v in cp.items() if k not in ("ranks", "summary"))])))
    if "memory" in plan:
        rows += _memory(plan["memory"])
    for key in ("trains", "data", "validation", "eval", "beta", "moving_average"):
        if key in plan:
            rows.append((key, _value(plan[key])))
    if "sampler" in plan:
        s = plan["sampler"]
        rows.append(("sampler", f"{s['scheduler']}, {s['steps']} steps, shift {s['shift']} (from {s['shift_from']}), seed clock {s['seed_clock']}"))
        rows.append(("guidance", f"{s['guidance']}  ({s['guidance_semantics']})"))
        r = plan["reward"]
        scored = f"; scores {r['frames']}" if "frames" in r else ""
        rows.append(("reward", f"{r['name']} at {r['endpoint']}, pinned revision {r['revision']!r}{scored}"))
    if "ray" in plan:  # NFT always; DPO with grid.backend = "ray"
        rows.append(("ray", _value(plan["ray"])))
    rows += [
        ("max steps", str(plan["max_steps"])),
        ("checkpoints", f"every {plan['checkpoint']['every']} steps, keep {plan['checkpoint']['keep']}: {_value(plan['checkpoint']['contents'])}"),
        ("seed contract", _value(plan["seed_contract"])),
        ("run identity", plan["identity"]),
        ("launch", shlex.join(plan["launch"])),
    ]
    for what, value in rows:
        table.add_row(what, Text(value))
    console.print(table)
