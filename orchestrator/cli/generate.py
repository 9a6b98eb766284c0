"""orch generate SPEC -o DIR: plan the spec and write the run dir atomically."""
from __future__ import annotations

import click

from .table import plural


@click.command(name="generate")
@click.argument("spec_path", metavar="SPEC", type=click.Path(dir_okay=False))
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Run dir to write (refused if it exists, unless --force).")
@click.option("--force", is_flag=True, help="Replace an existing run dir that orch generated (refused while a job "
              "runs in it, or when it holds training outputs or other files, unless --discard-outputs).")
@click.option("--discard-outputs", is_flag=True, help="With --force: also delete checkpoints, metrics.jsonl, wandb/, "
              "logs/ and any other file in the run dir.")
@click.option("--top", "top_k", default=5, show_default=True, type=click.IntRange(min=1),
              help="Candidates kept in plan.json.")
@click.option("--calibration", "calibration_path", type=click.Path(dir_okay=False),
              help="calib.json from `orch calibrate`: plan with the cost-model terms fitted to measured runs.")
@click.option("--measured", "measured_path", type=click.Path(dir_okay=False),
              help="doctor.json from `orch doctor`: measured bandwidths, latency and GEMM rate replace the catalog's.")
@click.option("--resume-from", "resume_from", type=click.Path(file_okay=False),
              help="A run dir to continue: the new run dir resumes from its newest checkpoint, converted to the new "
              "layout at launch (as `orch resize`; resume.json records how).")
@click.option("--plot", is_flag=True, help="Also save plan.png in the run dir: where the top candidates' step time "
              "and memory go (as `orch plan --plot`; not in manifest.json; needs pip install 'orch[plot]').")
def command(spec_path: str, out_dir: str, force: bool, discard_outputs: bool, top_k: int,
            calibration_path: str | None, measured_path: str | None, resume_from: str | None, plot: bool) -> None:
    """Write the run dir for SPEC: ds_config.json, megatron_args.txt, megatron_config.json, launch
    scripts (local, SLURM, pdsh), hostfile, plan.json, spec.resolved.yaml and manifest.json; with a
    program other than orch's trainer (program.kind), program.json: the argv every rank runs.

    Parallelism fields the spec leaves open are chosen by the planner (as `orch plan`).
    """
    from ..plan import build_plan
    from ..rundir import write_run_dir
    from ..spec_loader import load_spec
    from .plan import calibrated_cost

    if discard_outputs and not force:
        raise click.UsageError("--discard-outputs only makes sense with --force")
    if plot and resume_from:
        raise click.UsageError("--plot is not supported with --resume-from yet (run `orch plan --plot` on the spec)")
    if plot:
        from ..plotting import require_matplotlib

        require_matplotlib()
    spec = load_spec(spec_path)
    cost, measured = calibrated_cost(calibration_path, spec, measured_path)
    if resume_from is not None:
        from ..resize import plan_resize, write_resized

        resize = plan_resize(resume_from, spec)
        plan, resume = write_resized(resize, out_dir, top_k=top_k, cost=cost, measured=measured, force=force,
                                     discard_outputs=discard_outputs)
        echo_written(plan, out_dir)
        echo_resume(resume, resize.notes)
        return
    plan = build_plan(spec, top_k=top_k, cost=cost, measured=measured)
    pictures = None
    if plot:
        from ..plan_plot import plan_title, render_plan_png

        pictures = {"plan.png": render_plan_png(plan.plan_record(), plan_title(spec))}
    out = write_run_dir(plan, out_dir, force=force, discard_outputs=discard_outputs, pictures=pictures)
    echo_written(plan, out)


def echo_written(plan, out) -> None:
    """What generate (and resize) wrote: the layout, its notes, and the run dir on stdout."""
    from ..programs.argv import program_warnings
    from ..render.deepspeed import render_deepspeed_notes
    from ..render.megatron import render_megatron_notes

    lay = plan.layout
    click.echo(f"wrote {out}  ({lay.tag()}, world size {plan.world_size}, "
               f"{plural(plan.grad_accum_steps, 'micro-batch', 'micro-batches')}/step, "
               f"vocab padded to {plan.padded_vocab_size})", err=True)
    for note in render_megatron_notes(plan) + render_deepspeed_notes(plan):
        click.echo(f"note: {note}", err=True)
    for warning in program_warnings(plan):
        click.echo(f"warning: {warning}", err=True)
    click.echo(str(out))


def echo_resume(resume: dict, notes) -> None:
    conv = resume["conversion"]
    click.echo(f"resumes {resume['source_run_dir']} at step {resume['source_step']}; checkpoint: {conv['method']}"
               + (f" ({', '.join(conv['changes'])})" if conv["changes"] else "") + f"; lr schedule: "
               f"{resume['lr_schedule']}", err=True)
    for note in notes:
        click.echo(f"note: {note}", err=True)
