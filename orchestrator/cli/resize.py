"""orch resize RUN_DIR --nodes N: a new run dir that continues RUN_DIR on another cluster size (orchestrator.resize)."""
from __future__ import annotations

import click


@click.command(name="resize")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--nodes", required=True, type=click.IntRange(min=1), help="Nodes of the new cluster.")
@click.option("--gpus-per-node", type=click.IntRange(min=1), help="GPUs (processes) per node (default: the run's).")
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False),
              help="New run dir (default: RUN_DIR-<nodes>x<gpus>); refused if it exists, unless --force.")
@click.option("--scale-batch", is_flag=True, help="Scale the global batch with the data-parallel size (and the "
              "learning rate with it: the linear scaling rule) instead of keeping it.")
@click.option("--zero-stage", type=click.IntRange(0, 3), help="Also change the ZeRO stage (default: the run's).")
@click.option("--pipeline", type=click.IntRange(min=1),
              help="Also change the pipeline-parallel size (default: the run's).")
@click.option("--tensor", type=click.IntRange(min=1),
              help="Also change the tensor-parallel size (default: the run's; Megatron-LM programs reshard it).")
@click.option("--step", type=click.IntRange(min=1), help="Resume from RUN_DIR's checkpoint of this step (default: "
              "its newest intact one).")
@click.option("--force", is_flag=True,
              help="Replace an existing run dir that orch generated (as `orch generate --force`).")
def command(run_dir: str, nodes: int, gpus_per_node: int | None, out_dir: str | None, scale_batch: bool,
            zero_stage: int | None, pipeline: int | None, tensor: int | None, step: int | None,
            force: bool) -> None:
    """Re-plan RUN_DIR's spec for NODES x GPUS_PER_NODE (same model, precision and engine; same global batch
    unless --scale-batch) and write a new run dir that resumes from RUN_DIR's newest checkpoint: resume.json
    records the source, the step, both layouts and how the checkpoint is converted (at launch, before the
    ranks start). Exit 2, writing nothing, when the batch cannot divide (naming the nearest node counts that
    work) or the checkpoint cannot follow the change (naming it).
    """
    from ..resize import plan_resize, write_resized
    from .generate import echo_resume, echo_written

    layout = {k: v for k, v in (("zero_stage", zero_stage), ("pipeline", pipeline), ("tensor", tensor))
              if v is not None}
    resize = plan_resize(run_dir, nodes=nodes, gpus_per_node=gpus_per_node, scale_batch=scale_batch, layout=layout,
                         step=step)
    out = out_dir or f"{run_dir.rstrip('/')}-{nodes}x{resize.spec.cluster.gpus_per_node}"
    plan, resume = write_resized(resize, out, force=force)
    echo_written(plan, out)
    echo_resume(resume, resize.notes)

