"""The training loop that consumes a run dir: resume, train, measure, checkpoint, stop cleanly.

Per step: telemetry.begin -> engine.train_step (all micro-batches + optimizer step) -> telemetry.end
(one all_reduce; rank 0 writes metrics.jsonl / W&B / the progress line) -> checkpoint every
``training.checkpoint.interval`` steps, at the last step and when a stop signal arrived.

Exit codes (see signals.py): 0 done (train_iters or --max-steps reached, or nothing left to do), 75
stopped by SIGTERM/SIGUSR1/SIGINT after checkpointing (run again to resume), 2 unusable input (run dir,
world size, engine), 1 failure (an exception: its traceback is on stderr).

Files it writes in the run dir (rank 0): metrics.jsonl, train_info.json (per start: engine, layout,
start step, per-rank parameter counts and ZeRO-3 shard), train_status.json (at the end: finished or
preempted, last step, checkpoint step, exit code), wandb/ and wandb_run_id (W&B), checkpoints/.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import OrchError, SpecError
from . import checkpoint
from .signals import EXIT_FAILED, EXIT_INJECTED_FAULT, EXIT_OK, EXIT_PREEMPTED, StopRequest, exit_with_parent

INFO_FILE = "train_info.json"
STATUS_FILE = "train_status.json"


@dataclass(frozen=True)
class TrainOptions:
    run_dir: Path
    resume: bool = True
    max_steps: int | None = None
    engine: str | None = None      # None: the spec's training.engine
    telemetry: bool = True


def log(message: str) -> None:
    """A line for people, on stderr (rank 0 only: callers check)."""
    print(f"[orch-train] {message}", file=sys.stderr, flush=True)


def ensure_process_group_env() -> None:
    """Let ``python -m orchestrator.train RUN_DIR`` (no torchrun) run as a 1-process job."""
    if "RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})


_LOCK_FD: int | None = None


def hold_run_dir(path: Path) -> None:
    """Hold the run-dir lock shared for this process's life (see orchestrator.runlock): one job per run
    dir, and `orch cancel` finds every rank by it, whatever session or process group the rank is in."""
    global _LOCK_FD  # noqa: PLW0603  (one per process, released by the kernel at exit)
    from ..runlock import hold_shared  # noqa: PLC0415

    if _LOCK_FD is None:
        _LOCK_FD = hold_shared(path)


def check_world_size(spec) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != spec.world_size:
        raise SpecError(f"the run dir is for world_size({spec.world_size}) = num_nodes({spec.cluster.num_nodes})"
                        f" * gpus_per_node({spec.cluster.gpus_per_node}) processes, but WORLD_SIZE={world}",
                        path="WORLD_SIZE")


def write_json(path: Path, data: dict) -> None:
    from ..outfiles import replace_file  # noqa: PLC0415

    replace_file(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def run(options: TrainOptions) -> int:
    """Train the run dir with the chosen engine; returns the process exit code."""
    from ..rundir import read_run_dir  # noqa: PLC0415

    run_dir = read_run_dir(options.run_dir)
    injected_fault()             # a malformed ORCH_FAULT_* is a usage error now, not a traceback at step N
    hold_run_dir(run_dir.path)
    engine = options.engine or run_dir.spec.training.engine or "deepspeed"
    if engine == "megatron":
        return _run_megatron(run_dir, options)
    if engine != "deepspeed":
        raise SpecError(f"unknown engine {engine!r}", path="--engine")
    check_world_size(run_dir.spec)
    ensure_process_group_env()
    return _run_deepspeed(run_dir, options)


def _run_deepspeed(run_dir, options: TrainOptions) -> int:
    import deepspeed  # noqa: PLC0415
    import deepspeed.comm.comm as ds_comm  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    from deepspeed.accelerator import get_accelerator  # noqa: PLC0415

    from .convert import resume_source  # noqa: PLC0415
    from .data import build_dataset  # noqa: PLC0415
    from .engine import build_engine  # noqa: PLC0415
    from .ops import build_note, use_interpreter_tools  # noqa: PLC0415
    from .universal import LoadFailed  # noqa: PLC0415
    from ..telemetry.comm import ALLTOALL  # noqa: PLC0415
    from .session import TelemetrySession, resolved_layout  # noqa: PLC0415

    use_interpreter_tools()       # before DeepSpeed builds or loads its CPU op, whatever started this rank
    if os.environ.get("RANK", "0") == "0" and get_accelerator().device_name() == "cpu":
        note = build_note()
        if note:
            log(note)
    deepspeed.init_distributed(verbose=False)
    rank = dist.get_rank()
    spec = run_dir.spec
    accelerator = get_accelerator()
    synchronize = accelerator.synchronize if accelerator.device_name() != "cpu" else None
    session = TelemetrySession(run_dir, engine_name="deepspeed", rank=rank, enabled=options.telemetry,
                               synchronize=synchronize)
    session.install_comm(ds_comm.cdb)
    session.install_comm(dist, ALLTOALL)      # the trainer's own all-to-alls (MoE dispatch, Ulysses)
    session.start_wandb(run_dir)
    source = resume_source(run_dir, resume=options.resume, rank=rank)     # a resized run's converted checkpoint
    ds_config = source.ds_config(run_dir.ds_config) if source else run_dir.ds_config
    engine = build_engine(spec, ds_config, build_dataset(spec, run_dir.path), session.busy, resolved_layout(run_dir))
    session.comm.set_dp_ranks(engine.dp_ranks)
    try:
        code = train_loop(run_dir, options, engine, session, rank, source)
    except LoadFailed as e:       # raised on every rank at once: end cleanly (a rank left to exit hangs in gloo)
        if rank == 0:
            log(f"error: {e}")
        code = EXIT_FAILED
    engine.close()
    dist.destroy_process_group()
    return code


def _run_megatron(run_dir, options: TrainOptions) -> int:
    """Train with Megatron-Core (GPU only); same loop, telemetry and checkpoints as the DeepSpeed path."""
    import torch  # noqa: PLC0415

    from .megatron_engine import MegatronEngine, MegatronUnavailable, unsupported_reason  # noqa: PLC0415

    if not torch.cuda.is_available():
        raise MegatronUnavailable(
            "--engine megatron needs CUDA GPUs: Megatron-Core's GPT forward, RNG tracker and pipeline schedules "
            "call CUDA directly. On CPU use --engine deepspeed; `python -m orchestrator.train.megatron_engine "
            "--check RUN_DIR` (under torchrun) checks the parts of Megatron-Core that do run on CPU")
    reason = unsupported_reason(run_dir.spec)
    if reason:
        raise MegatronUnavailable(reason)
    import torch.distributed as dist  # noqa: PLC0415

    from .data import build_dataset  # noqa: PLC0415
    from .session import TelemetrySession  # noqa: PLC0415

    check_world_size(run_dir.spec)
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    session = TelemetrySession(run_dir, engine_name="megatron", rank=rank, enabled=options.telemetry,
                               synchronize=torch.cuda.synchronize)
    session.install_comm(dist)
    session.start_wandb(run_dir)
    import megatron.core.distributed.param_and_grad_buffer as buffers  # noqa: PLC0415

    if options.telemetry:
        session.comm.install(buffers, {"dist_reduce_scatter_func": "reduce_scatter_tensor",
                                       "dist_all_gather_func": "all_gather_into_tensor"})
    engine = MegatronEngine(run_dir, build_dataset(run_dir.spec, run_dir.path), session.busy)
    session.comm.set_dp_ranks(engine.dp_ranks)
    code = train_loop(run_dir, options, engine, session, rank)
    engine.close()
    dist.destroy_process_group()
    return code


def resume_step(run_dir, options: TrainOptions, engine, rank: int, source=None) -> int:
    """Load the newest intact checkpoint when resuming (else a resized run's converted ``source``); drop
    metrics records after it. Returns the start step."""
    import torch.distributed as dist  # noqa: PLC0415

    from ..resize import UNIVERSAL_PARAMS  # noqa: PLC0415
    from ..telemetry.sinks import METRICS_FILE, truncate_metrics  # noqa: PLC0415

    ckpt_dir = checkpoint.checkpoint_dir(run_dir.path, run_dir.spec)
    choice = [choose_checkpoint(ckpt_dir) if rank == 0 and options.resume else None]
    dist.broadcast_object_list(choice, src=0)      # every rank loads the step rank 0 verified
    start = engine.load(ckpt_dir, choice[0]) if choice[0] is not None else 0
    if choice[0] is None and source is not None:
        start = engine.load_source(source)
        engine.follow_schedule()
        if rank == 0:
            log(f"resized run: resumed from {source.ckpt_dir / checkpoint.tag_for(source.step)} ({source.method}, "
                f"step {start})" + ("; every parameter's fp32 weights, Adam moments and the step count verified "
                                    "against it" if source.method == UNIVERSAL_PARAMS else ""))
    if rank == 0:
        dropped = truncate_metrics(run_dir.path / METRICS_FILE, start)
        if choice[0] is not None:
            log(f"resumed from {ckpt_dir / checkpoint.tag_for(start)} (step {start}); "
                f"dropped {dropped} metrics record(s) after it")
        elif dropped:
            log(f"no usable checkpoint: starting at step 0; dropped {dropped} metrics record(s)")
    dist.barrier()
    return start


def choose_checkpoint(ckpt_dir: Path) -> int | None:
    """Rank 0: the newest intact checkpoint; newer unusable ones are named, renamed aside, and ``latest``
    is pointed at the one chosen."""
    choice = checkpoint.resume_choice(ckpt_dir)
    for step, problem in choice.unusable:
        log(f"warning: checkpoint {checkpoint.tag_for(step)} is unusable ({problem}); trying an older one")
    if choice.step is None and choice.unusable:
        log("warning: no intact checkpoint: starting from step 0")
    for moved in checkpoint.set_aside(ckpt_dir, [step for step, _ in choice.unusable]):
        log(f"set aside as {moved}")
    if choice.step is not None and checkpoint.latest_step(ckpt_dir) != choice.step:
        checkpoint.write_latest(ckpt_dir, choice.step)
    return choice.step


def injected_fault() -> tuple[int, int] | None:
    """(step, rank) of ORCH_FAULT_AT_STEP / ORCH_FAULT_RANK, or None; a SpecError naming the variable when
    either is not a whole number."""
    at = os.environ.get("ORCH_FAULT_AT_STEP")
    if not at:
        return None
    values = {}
    for name, default in (("ORCH_FAULT_AT_STEP", None), ("ORCH_FAULT_RANK", "0")):
        text = os.environ.get(name, default)
        if not text.strip().isdigit():
            raise SpecError(f"must be a whole number >= 0, got {text!r}", path=name)
        values[name] = int(text)
    return values["ORCH_FAULT_AT_STEP"], values["ORCH_FAULT_RANK"]


def fail_if_injected(step: int, rank: int) -> None:
    """Fault injection for testing launchers against a real failing rank: with ORCH_FAULT_AT_STEP=N (and
    ORCH_FAULT_RANK=R, default 0) rank R exits with EXIT_INJECTED_FAULT when it reaches step N."""
    at = os.environ.get("ORCH_FAULT_AT_STEP")
    if injected_fault() == (step, rank):
        print(f"[orch-train] rank {rank}: injected fault at step {step} (ORCH_FAULT_AT_STEP={at}), "
              f"exiting {EXIT_INJECTED_FAULT}", file=sys.stderr, flush=True)
        os._exit(EXIT_INJECTED_FAULT)


def train_loop(run_dir, options: TrainOptions, engine, session, rank: int, source=None) -> int:
    """Resume, run the steps, checkpoint; returns EXIT_OK or EXIT_PREEMPTED (all ranks agree)."""
    import torch.distributed as dist  # noqa: PLC0415

    spec = run_dir.spec
    ckpt_dir = checkpoint.checkpoint_dir(run_dir.path, spec)
    interval = spec.training.checkpoint.interval
    start = resume_step(run_dir, options, engine, rank, source)
    last = spec.training.train_iters if options.max_steps is None else min(options.max_steps,
                                                                           spec.training.train_iters)
    _write_info(run_dir, engine, session, start, rank)
    telemetry = session.open(run_dir, engine, total_steps=spec.training.train_iters, start_step=start,
                             device=engine.device)
    stop = StopRequest().install()
    code, step, saved = EXIT_OK, start, start
    try:
        for step in range(start + 1, last + 1):
            fail_if_injected(step, rank)
            telemetry.begin()
            result = engine.train_step(step)
            _, stop_now = telemetry.end(step=step, loss=result.loss, lr=result.lr, grad_norm=result.grad_norm,
                                        stop_requested=stop.requested is not None, moe_counts=result.moe_counts)
            if stop_now or step % interval == 0 or step == last:
                engine.save(ckpt_dir, step)
                saved = step
            if stop_now:
                code = EXIT_PREEMPTED
                if rank == 0:
                    log(f"stop requested ({stop.requested or 'signal on another rank'}): checkpoint of step "
                        f"{step} saved, exiting {EXIT_PREEMPTED} (run again to resume)")
                break
    except BaseException:
        code = EXIT_FAILED
        raise
    finally:
        stop.uninstall()
        telemetry.close(exit_code=code)
    if rank == 0:
        write_json(run_dir.path / STATUS_FILE, {"state": "preempted" if code else "finished", "step": step,
                                                "checkpoint_step": saved, "exit_code": code,
                                                "time_unix": time.time()})
        log(f"{'stopped' if code else 'finished'} at step {step}/{spec.training.train_iters}; "
            f"metrics: {run_dir.path / 'metrics.jsonl'}" + (f"; wandb: {session.wandb_dir}" if session.wandb_dir
                                                           else ""))
    dist.barrier()
    return code


def _write_info(run_dir, engine, session, start: int, rank: int) -> None:
    """train_info.json (rank 0): what this start of the job found and built, per rank."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    ranks = [None] * dist.get_world_size()
    where = {"host": socket.gethostname(), "slurm_node": os.environ.get("SLURMD_NODENAME")}
    dist.all_gather_object(ranks, {"rank": rank, **where, **engine.info()})
    if rank != 0:
        return
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    versions = {"torch": torch.__version__}
    for package in ("deepspeed", "megatron-core", "wandb"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            pass
    write_json(run_dir.path / INFO_FILE, {
        "engine": session.engine_name, "world_size": dist.get_world_size(), "start_step": start,
        "layout": session.layout_tag, "param_count": ranks[0]["param_count"], "ranks": ranks,
        "versions": versions, "telemetry": session.enabled,
    })


def main(argv: list[str] | None = None) -> int:
    import argparse  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="python -m orchestrator.train",
                                     description="Train a run dir written by `orch generate` (start it "
                                                 "with torchrun: see the run dir's launch_local.sh).")
    parser.add_argument("run_dir", type=Path, help="the run dir (spec.resolved.yaml, ds_config.json, ...)")
    parser.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                        help="continue from the newest checkpoint when there is one (default: yes)")
    parser.add_argument("--max-steps", type=int, default=None,
                        help="stop (with a checkpoint) once this global step is reached")
    parser.add_argument("--engine", choices=("deepspeed", "megatron"), default=None,
                        help="the runtime (default: the spec's training.engine)")
    parser.add_argument("--no-telemetry", dest="telemetry", action="store_false",
                        help="no per-step metrics (metrics.jsonl, W&B, progress lines)")
    args = parser.parse_args(argv)
    exit_with_parent()
    if args.max_steps is not None and args.max_steps < 1:
        parser.error("--max-steps must be >= 1")
    options = TrainOptions(run_dir=args.run_dir, resume=args.resume, max_steps=args.max_steps,
                           engine=args.engine, telemetry=args.telemetry)
    try:
        return run(options)
    except OrchError as e:
        print(f"orch-train: error: {e}", file=sys.stderr)
        return e.exit_code
