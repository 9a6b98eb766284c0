"""orch init: write a commented starting spec."""
from __future__ import annotations

import click

from ..catalog.gpus import GPUS
from ..catalog.models import MODELS


@click.command(name="init")
@click.option("--preset", default="tiny-gpt", show_default=True, type=click.Choice(list(MODELS)),
              metavar="PRESET", help="Model preset (see --list-presets).")
@click.option("--gpu", type=click.Choice(list(GPUS)), metavar="GPU",
              help="GPU catalog key [default: cpu for tiny-gpt, else h100-sxm].")
@click.option("--nodes", "num_nodes", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--gpus-per-node", type=click.IntRange(min=1), help="[default: 2 on cpu, else 8]")
@click.option("--name", help="Run name [default: PRESET-pretrain].")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write here instead of stdout.")
@click.option("--force", is_flag=True, help="Overwrite an existing --output file.")
@click.option("--list-presets", is_flag=True, help="List model presets and GPUs, then exit.")
def command(preset, gpu, num_nodes, gpus_per_node, name, output, force, list_presets) -> None:
    """Write a commented starting spec (stdout, or -o FILE)."""
    from ..init import list_presets as listing, render_starter_spec, write_new_file

    if list_presets:
        click.echo(listing())
        return
    text = render_starter_spec(preset=preset, gpu=gpu, num_nodes=num_nodes, gpus_per_node=gpus_per_node,
                               name=name, file_name=output or "spec.yaml")
    if output is None:
        click.echo(text, nl=False)
        return
    write_new_file(output, text, force=force)
    click.echo(f"wrote {output}", err=True)
