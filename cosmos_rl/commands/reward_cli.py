"""`cosmos-rl reward ...`: serve the reward service, convert a published head or the HPSv2.1 checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from cosmos_rl.commands.console import fail as _fail, out
from cosmos_rl.commands.options import bind_host, finite_float
from cosmos_rl.core.errors import UserError

reward_app = typer.Typer(no_args_is_help=True, help="The HTTP reward service that scores NFT and GRPO rollouts.")


@reward_app.command("serve")
def reward_serve(
    host: str = typer.Option("127.0.0.1", help="Address to bind (loopback by default); any other needs --token-env or --insecure."),
    port: int = typer.Option(8000, help="Port to bind; 0 picks a free one (uvicorn only)."),
    revision: str = typer.Option(..., help="Revision the service declares; runs pin it in rl.reward.revision."),
    token_env: str = typer.Option("", help="Environment variable holding a bearer token clients must send."),
    model: Optional[List[str]] = typer.Option(None, "--model", help="NAME=FOLDER: serve a model reward (pickscore, clipscore, aesthetic, hps, videoalign) from a local folder; repeatable."),
    insecure: bool = typer.Option(False, "--insecure", help="Allow a non-loopback --host without a token."),
    replicas: int = typer.Option(0, help="Serve on this many Ray Serve replicas (joins RAY_ADDRESS / --ray-address, else starts a local cluster); 0 = one uvicorn process."),
    cpus_per_replica: float = typer.Option(1.0, parser=finite_float, help="CPUs each Ray Serve replica reserves."),
    gpus_per_replica: float = typer.Option(0.0, parser=finite_float, help="GPUs each Ray Serve replica reserves (model rewards then run on CUDA)."),
    ray_address: str = typer.Option("", help="Ray cluster to join with --replicas; empty = RAY_ADDRESS, else a local cluster."),
) -> None:
    """Serve the built-in rewards (and model rewards from local folders) over HTTP until interrupted."""
    import os

    from cosmos_rl.rewards.registry import parse_model_specs

    try:
        host = bind_host(host)
        token = None
        if token_env:
            token = os.environ.get(token_env)
            if not token:
                raise UserError(f"--token-env: environment variable {token_env} is empty or unset; export it or drop --token-env")
        models = parse_model_specs(model or [])
        if replicas:
            from cosmos_rl.rewards.serve_ray import serve_forever_ray

            serve_forever_ray(host, port, revision, token, models, insecure, replicas, cpus_per_replica, gpus_per_replica, ray_address)
        else:
            from cosmos_rl.rewards.server import serve_forever_cli

            serve_forever_cli(host, port, revision, token, models, insecure)
    except UserError as exc:
        _fail(exc)


@reward_app.command("convert-head")
def reward_convert_head(
    source: Path = typer.Argument(..., help="The published head, a pickled .pth/.pt state dict."),
    target: Path = typer.Argument(..., help="Where to write it as safetensors, e.g. FOLDER/aesthetic_head.safetensors."),
) -> None:
    """One-time: convert a pickled aesthetic head to safetensors (read with weights_only=True, so no code runs)."""
    from cosmos_rl.rewards.models import convert_head

    try:
        names = convert_head(source, target)
    except UserError as exc:
        _fail(exc)
    out.print(f"[bold green]wrote[/] {escape(str(target))} ({len(names)} tensors: {escape(', '.join(names))})", highlight=False)


@reward_app.command("convert-hps")
def reward_convert_hps(
    source: Path = typer.Argument(..., help="The released HPSv2.1 checkpoint (HPS_v2.1_compressed.pt): an open_clip ViT-H-14 state dict, a torch pickle."),
    out_dir: Path = typer.Option(..., "--out", help="The folder to write (new or empty): a transformers CLIP folder for --model hps=FOLDER."),
    tokenizer_from: Path = typer.Option(..., "--tokenizer-from", help="A local transformers CLIP ViT-H-14 folder whose tokenizer is copied (e.g. laion/CLIP-ViT-H-14-laion2B-s32B-b79K saved locally)."),
    vision_heads: int = typer.Option(16, help="Attention heads of the vision tower (open_clip ViT-H-14: 16); shapes do not tell them."),
    text_heads: int = typer.Option(16, help="Attention heads of the text tower (open_clip ViT-H-14: 16); shapes do not tell them."),
    quick_gelu: bool = typer.Option(False, "--quick-gelu", help="The checkpoint's CLIP uses QuickGELU (OpenAI-trained towers); ViT-H-14 and HPSv2.1 use GELU."),
) -> None:
    """One-time: convert the HPSv2.1 open_clip checkpoint to a transformers CLIP folder (read with weights_only=True, so no code runs)."""
    from cosmos_rl.rewards.hps_convert import convert_hps

    try:
        config = convert_hps(source, out_dir, tokenizer_from, vision_heads, text_heads, quick_gelu)
    except UserError as exc:
        _fail(exc)
    v, t = config["vision_config"], config["text_config"]
    out.print(
        f"[bold green]wrote[/] {escape(str(out_dir))} (vision {v['num_hidden_layers']} layers x {v['hidden_size']}, patch {v['patch_size']}, "
        f"{v['image_size']}px; text {t['num_hidden_layers']} layers x {t['hidden_size']}; embeddings {config['projection_dim']}); "
        f"serve it with --model hps={escape(str(out_dir))}",
        highlight=False,
    )
