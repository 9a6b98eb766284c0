"""The W&B sink: exactly one run per job (rank 0), offline unless the user is set up for online.

- Mode: ``WANDB_MODE`` from the environment when set, else the spec's ``tracking.wandb.mode`` (offline
  by default: no account, no network; ``wandb sync`` uploads later). ``online`` without credentials
  (no ``WANDB_API_KEY``, no netrc entry for the W&B host) falls back to offline with a warning, and so
  does online when the server cannot be reached or refuses the key (``wandb.init`` fails).
- Run: name = spec name, group and tags from the spec plus the layout tag (``tp1-pp1-dp2-z2-mb2``),
  the precision and the engine; config = the resolved spec and the plan's chosen record; the plan's
  predictions as ``predicted/<metric>`` in config and summary. ``step`` is the x-axis of every metric.
- The run id is kept in ``wandb_run_id`` in the run dir, so a resumed job continues the same W&B run.
- A resized run (resume.json) is a new W&B run in its source's group (whatever its own spec's group) that names
  its parent: ``resumed_from`` in config and summary (source run dir, W&B run id, step, both layouts).
- Secrets: nothing from the environment is put in the config; the API key is never logged or written
  by orch (wandb reads it itself, and only in online mode).
"""
from __future__ import annotations

import netrc
import os
import re
import secrets
import string
import sys
from pathlib import Path
from urllib.parse import urlparse

from ..outfiles import read_regular_no_follow, replace_file
from .record import MetricsRecord
from .sinks import record_dict

RUN_ID_FILE = "wandb_run_id"
RESUME_FILE = "resume.json"      # orchestrator.resize.RESUME_FILE (written by orch resize / generate --resume-from)
DEFAULT_HOST = "api.wandb.ai"


def has_wandb_credentials(env: dict | None = None) -> bool:
    """True when wandb could authenticate: WANDB_API_KEY set, or a netrc entry for the W&B host."""
    env = os.environ if env is None else env
    if env.get("WANDB_API_KEY"):
        return True
    host = urlparse(env.get("WANDB_BASE_URL", "")).hostname or DEFAULT_HOST
    try:
        path = env.get("NETRC") or None
        return netrc.netrc(path).authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def resolve_wandb_mode(spec_mode: str, env: dict | None = None) -> tuple[str, str | None]:
    """(mode, note): the environment's WANDB_MODE wins over the spec; online needs credentials."""
    env = os.environ if env is None else env
    mode = env.get("WANDB_MODE") or spec_mode
    if mode == "dryrun":
        mode = "offline"
    if mode == "online" and not has_wandb_credentials(env):
        return "offline", "W&B mode 'online' but not logged in (no WANDB_API_KEY, no netrc entry): logging offline"
    return mode, None


# Plan estimate -> the metric it predicts.
PREDICTED = {"step_time_s": "step_time_s", "tokens_per_s": "tokens_per_s", "tflops_per_gpu": "tflops_per_gpu",
             "mfu": "mfu", "hfu": "hfu", "bubble_fraction": "bubble_fraction", "flops_per_step": "flops_per_step"}


def predicted_values(chosen: dict) -> dict:
    """``predicted/<name>`` values from plan.json's chosen record (empty when it has no estimates)."""
    out = {}
    for key, name in PREDICTED.items():
        if isinstance(chosen.get(key), (int, float)) and not isinstance(chosen.get(key), bool):
            out[f"predicted/{name}"] = chosen[key]
    memory, comm = chosen.get("memory") or {}, chosen.get("comm") or {}
    if isinstance(memory.get("total_bytes"), (int, float)):
        out["predicted/mem_peak_bytes"] = memory["total_bytes"]
    # Measured allreduce_time_s / comm_exposed_s cover the data-parallel gradient reductions only, so the
    # predictions that stand beside them are the reductions (no ZeRO parameter gathers) and the DP exposure.
    reduce_s = comm.get("dp_reduce_s", comm.get("dp_s"))
    if isinstance(reduce_s, (int, float)):
        out["predicted/allreduce_time_s"] = reduce_s
        step = chosen.get("step_time_s")
        if isinstance(step, (int, float)) and step > 0:
            out["predicted/allreduce_overhead"] = reduce_s / step
    exposed = comm.get("dp_exposed_s", comm.get("exposed_s"))
    if isinstance(exposed, (int, float)):
        out["predicted/comm_exposed_s"] = exposed
    out.update(_predicted_moe_cp(chosen, comm))
    return out


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _predicted_moe_cp(chosen: dict, comm: dict) -> dict:
    """MoE and context parallelism (issue 10). Measured alltoall_time_s covers every all-to-all: the expert
    dispatch and combine (``comm.ep_s``) and, with the DeepSpeed engine, the Ulysses exchanges
    (``comm.cp_s``; with Megatron cp_s is the K/V ring, point-to-point, not an all-to-all). The load
    imbalance prediction is plan.json's ``moe.load_imbalance`` (or ``expert_load_imbalance``) when it has one."""
    out = {}
    parts = [comm.get("ep_s")] + ([comm.get("cp_s")] if chosen.get("engine") == "deepspeed" else [])
    if any(_number(p) for p in parts) and (chosen.get("ep", 1) or 1) * (chosen.get("cp", 1) or 1) > 1:
        out["predicted/alltoall_time_s"] = sum(p for p in parts if _number(p))
    moe = chosen.get("moe") if isinstance(chosen.get("moe"), dict) else {}
    imbalance = moe.get("load_imbalance", chosen.get("expert_load_imbalance"))
    if _number(imbalance):
        out["predicted/expert_load_imbalance"] = imbalance
    return out


def run_tags(spec_tags: list, layout_tag: str, precision: str, engine: str) -> list[str]:
    tags = list(spec_tags)
    for tag in (layout_tag, precision, engine):
        if tag not in tags:
            tags.append(tag)
    return tags


def resumed_from(run_dir: Path) -> dict | None:
    """A resized run's parent, from its resume.json (None for any other run, or when the file is unreadable)."""
    import json  # noqa: PLC0415

    data = read_regular_no_follow(Path(run_dir) / RESUME_FILE, 1 << 20)
    try:
        r = json.loads(data) if data else None
        if not isinstance(r, dict):
            return None
        wandb = r.get("source_wandb") or {}
        return {"run_dir": r["source_run_dir"], "step": r["source_step"], "wandb_run_id": wandb.get("run_id"),
                "wandb_group": wandb.get("group"), "checkpoint": r.get("source_checkpoint"),
                "conversion": (r.get("conversion") or {}).get("method"),
                "old_layout": layout_tag_of(r.get("old_layout") or {}), "new_layout": layout_tag_of(r.get("new_layout") or {})}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def layout_tag_of(layout: dict) -> str:
    """A resume.json layout record as `orch status` shows it: 2x4 tp2-pp2-dp2-z1."""
    return (f"{layout.get('num_nodes')}x{layout.get('gpus_per_node')} tp{layout.get('tp')}-pp{layout.get('pp')}-"
            f"dp{layout.get('dp')}-z{layout.get('zero_stage')}")


class WandbSink:
    """Logs each record to one W&B run. Construct on rank 0 only."""

    def __init__(self, *, run_dir: Path, spec_data: dict, wandb_spec, chosen: dict, layout_tag: str,
                 precision: str, engine: str, mode: str):
        import wandb  # noqa: PLC0415  (only the trainer's rank 0 pays for it)

        run_dir = Path(run_dir)
        run_id = _run_id(run_dir)
        predicted = predicted_values(chosen)
        config = {"spec": spec_data, "plan": chosen, "layout": layout_tag, "engine": engine, **predicted}
        parent = resumed_from(run_dir)
        group = (parent or {}).get("wandb_group") or wandb_spec.group or spec_data["name"]
        tags = run_tags(wandb_spec.tags, layout_tag, precision, engine) + (["resized"] if parent else [])
        if parent:
            config["resumed_from"] = parent
        settings = wandb.Settings(console="off", x_disable_stats=True, save_code=False, disable_git=True,
                                  silent=True)
        self.run = wandb.init(project=wandb_spec.project, entity=wandb_spec.entity, name=spec_data["name"],
                              group=group, tags=tags,
                              config=config, dir=str(run_dir), mode=mode, id=run_id, resume="allow",
                              settings=settings)
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")
        for key, value in predicted.items():
            self.run.summary[key] = value
        if parent:
            self.run.summary["resumed_from"] = parent

    @property
    def directory(self) -> str:
        """The offline/online run directory (holds the .wandb file)."""
        files = getattr(self.run, "dir", "") or ""
        return str(Path(files).parent) if files else ""

    def write(self, record: MetricsRecord) -> None:
        values = record_dict(record)
        source = values.pop("telemetry_source", None)     # per run, not per step: the run's config
        if source and self.run.config.get("telemetry_source") != source:
            self.run.config.update({"telemetry_source": source}, allow_val_change=True)
        self.run.log(values)

    def alert(self, title: str, text: str) -> None:
        """A W&B alert (a warning); offline, or when W&B refuses it, a note on stderr and training goes on."""
        try:
            import wandb  # noqa: PLC0415

            self.run.alert(title=title, text=text, level=wandb.AlertLevel.WARN, wait_duration=300)
        except Exception as e:  # noqa: BLE001  (an alert must never stop training)
            print(f"[orch-train] note: W&B alert not sent ({e.__class__.__name__}: {e})", file=sys.stderr, flush=True)

    def close(self, *, exit_code: int = 0) -> None:
        self.run.finish(exit_code=exit_code)


RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")   # a W&B run id, and the name of its folder


def _run_id(run_dir: Path) -> str:
    """The run id kept in ``wandb_run_id`` (read only from a regular file, never through a link, and only
    when it looks like a W&B run id), else a new one, written atomically (a link there is replaced)."""
    path = run_dir / RUN_ID_FILE
    data = read_regular_no_follow(path, 256)
    text = data.decode("utf-8", "replace").strip() if data is not None else ""
    if RUN_ID_PATTERN.fullmatch(text):
        return text
    run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
    if data is not None or os.path.lexists(path):
        print(f"[orch-train] warning: {path} is not a regular file holding a W&B run id ([A-Za-z0-9_-], at most "
              f"64 characters); starting a new W&B run {run_id} and replacing it", file=sys.stderr, flush=True)
    try:
        replace_file(path, run_id + "\n")
    except OSError as e:      # e.g. a directory in the way: W&B still runs, a resumed job starts a new run
        print(f"[orch-train] warning: cannot save the W&B run id in {path} ({e.strerror}): a resumed job will "
              "start a new W&B run", file=sys.stderr, flush=True)
    return run_id


def open_wandb_sink(*, run_dir, spec, spec_data: dict, chosen: dict, layout_tag: str, engine: str):
    """The sink for the spec's tracking settings, or None when W&B is disabled."""
    mode, note = resolve_wandb_mode(spec.tracking.wandb.mode)
    if note:
        print(f"[orch-train] warning: {note}", file=sys.stderr, flush=True)
    if mode == "disabled":
        return None
    args = dict(run_dir=run_dir, spec_data=spec_data, wandb_spec=spec.tracking.wandb, chosen=chosen,
                layout_tag=layout_tag, precision=spec.training.precision, engine=engine)
    if mode != "online":
        return WandbSink(**args, mode=mode)
    return _online_or_offline(args)


def _online_or_offline(args: dict):
    """Online W&B, or offline with a warning when the server cannot be reached or refuses the key:
    tracking must never be what kills a training job."""
    import wandb  # noqa: PLC0415

    try:
        return WandbSink(**args, mode="online")
    except (wandb.errors.Error, OSError) as e:
        reason = " ".join(str(e).split())[:300]
        print(f"[orch-train] warning: W&B online failed ({e.__class__.__name__}: {reason}); logging offline "
              "instead (upload later with `wandb sync`)", file=sys.stderr, flush=True)
        wandb.teardown()     # the failed attempt still holds the run id in wandb's service
        return WandbSink(**args, mode="offline")
