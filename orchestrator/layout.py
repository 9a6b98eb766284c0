"""The parallel layout and the structural rules every layout must satisfy.

Each rule is a small pure function ``rule(spec, layout) -> Problem | None`` that shows its operands
(``tp(8) * pp(4) * dp(3) = 96 != world_size(64)``) and says how to fix it. A rule whose operands are
not all known yet (a field left open for the planner) passes. ``rules.check_spec`` runs every rule (these and
parallel_rules.py's) on the fields the user fixed; the planner runs the same rules on each complete candidate.
Nothing is ever derived by silent floor division.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Optional

from .errors import Problem, SpecError
from .spec import Spec, default_engine
from .stages import SplitIssue, StageSplit, accounted_split, even_split_issue, split_issues, stage_split

P = "parallelism"


@dataclass(frozen=True)
class Layout:
    """A parallel layout. Fields are None while still open (a partial layout from the spec)."""

    tp: Optional[int] = None
    pp: Optional[int] = None
    vpp: Optional[int] = None
    dp: Optional[int] = None
    zero_stage: Optional[int] = None
    micro_batch_size: Optional[int] = None
    sequence_parallel: Optional[bool] = None
    recompute: Optional[str] = None
    offload: Optional[str] = None
    # Uneven pipeline split (Megatron's --decoder-first/last-pipeline-num-layers): None = the middle
    # stages' equal share, both None = the even split. Never "open": None is a complete value here.
    first_stage_layers: Optional[int] = None
    last_stage_layers: Optional[int] = None
    # Context parallelism and MoE expert parallelism (MoE parallel folding: attention over tp x cp x dp x pp,
    # experts over etp x ep x edp x pp on the same ranks). Default 1: a layout without them; None = open.
    cp: Optional[int] = 1
    ep: Optional[int] = 1
    etp: Optional[int] = 1
    # Megatron's --account-for-embedding/loss-in-pipeline-split: True, False, or None = undecided (the spec
    # left it open; the planner's layouts say True or False). Never counted as an open field.
    account_split: Optional[bool] = None
    # Megatron's --recompute-modules with recompute selective (parallelism.recompute_modules, sorted); None =
    # Megatron's default, core attention alone. Never "open": the planner may try module sets when recompute is.
    recompute_modules: Optional[tuple[str, ...]] = None
    # Hybrid sharding (ZeRO-3): model states sharded over shard_degree data-parallel ranks, replicated across
    # dp / shard_degree groups. None = the whole data-parallel group (a complete value, never "open").
    shard_degree: Optional[int] = None

    @property
    def is_complete(self) -> bool:
        return not self.open_fields()

    def open_fields(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self)
                if f.name not in SPLIT_FIELDS and getattr(self, f.name) is None]

    @property
    def is_uneven(self) -> bool:
        return self.first_stage_layers is not None or self.last_stage_layers is not None

    @property
    def model_parallel_size(self) -> int:
        return self.tp * self.pp

    @property
    def replicas(self) -> int:
        """Copies of the sharded model states: dp / shard_degree (1 without hybrid sharding)."""
        return self.dp // self.shard_degree if self.shard_degree else 1

    @property
    def edp(self) -> int:
        """Expert-data-parallel degree: the ranks holding the same experts (world / (etp * ep * pp))."""
        return self.tp * self.cp * self.dp // (self.etp * self.ep)

    def tag(self) -> str:
        """Short name used for W&B tags and tables: tp8-pp4-dp2-z1-mb1."""
        vpp = f"-v{self.vpp}" if self.vpp and self.vpp > 1 else ""
        split = f"-f{self.first_stage_layers or ''}l{self.last_stage_layers or ''}" if self.is_uneven else ""
        split += "-ael" if self.account_split else ""
        cp = f"-cp{self.cp}" if self.cp and self.cp > 1 else ""
        ep = f"-ep{self.ep}" if self.ep and self.ep > 1 else ""
        etp = f"-etp{self.etp}" if self.etp and self.etp > 1 else ""
        hs = f"-hs{self.shard_degree}" if self.shard_degree else ""
        return (f"tp{self.tp}{cp}-pp{self.pp}{vpp}{split}{ep}{etp}-dp{self.dp}-z{self.zero_stage}{hs}"
                f"-mb{self.micro_batch_size}")


SPLIT_FIELDS = ("first_stage_layers", "last_stage_layers", "account_split", "recompute_modules", "shard_degree")


# Spec field (dotted path) for each layout field, so problems name what the user writes.
FIELD_PATHS = {"tp": f"{P}.tensor", "pp": f"{P}.pipeline", "vpp": f"{P}.virtual_pipeline", "dp": f"{P}.data",
               "zero_stage": f"{P}.zero_stage", "micro_batch_size": f"{P}.micro_batch_size",
               "sequence_parallel": f"{P}.sequence_parallel", "recompute": f"{P}.recompute",
               "offload": f"{P}.offload", "first_stage_layers": f"{P}.first_stage_layers",
               "last_stage_layers": f"{P}.last_stage_layers", "cp": f"{P}.context", "ep": f"{P}.expert",
               "etp": f"{P}.expert_tensor", "shard_degree": f"{P}.shard_degree",
               "account_split": f"{P}.account_for_embedding_loss", "recompute_modules": f"{P}.recompute_modules"}


def layout_from_spec(spec: Spec) -> Layout:
    """The partial layout the user fixed (dp derived from the world size when tp and pp are known)."""
    p = spec.parallelism
    cp = fixed_context(spec)
    dp = p.data
    if dp is None and p.tensor and p.pipeline and cp and spec.world_size % (p.tensor * p.pipeline * cp) == 0:
        dp = spec.world_size // (p.tensor * p.pipeline * cp)
    moe = spec.model.moe is not None
    return Layout(tp=p.tensor, pp=p.pipeline, vpp=p.virtual_pipeline, dp=dp, zero_stage=p.zero_stage,
                  micro_batch_size=p.micro_batch_size, sequence_parallel=p.sequence_parallel,
                  recompute=p.recompute, offload=p.offload, first_stage_layers=p.first_stage_layers,
                  last_stage_layers=p.last_stage_layers, cp=cp,
                  ep=p.expert if p.expert is not None or moe else 1,
                  etp=p.expert_tensor if p.expert_tensor is not None or moe else 1,
                  account_split=p.account_for_embedding_loss, shard_degree=p.shard_degree,
                  recompute_modules=tuple(sorted(set(p.recompute_modules))) if p.recompute_modules else None)


def fixed_context(spec: Spec) -> int | None:
    """cp as the spec fixes it: parallelism.context, or 1 when tensor and pipeline are given without it
    (the layout as written before context parallelism: tp and pp fixed, dp takes the rest); otherwise None
    (open: the planner searches it). Never derived from the other degrees."""
    p = spec.parallelism
    if p.context is not None:
        return p.context
    return 1 if p.tensor is not None and p.pipeline is not None else None


def layout_split(num_layers: int, layout: Layout) -> StageSplit:
    """Layers per pipeline stage of a complete layout that passed the rules."""
    return _split(num_layers, layout.pp, layout.first_stage_layers, layout.last_stage_layers,
                  bool(layout.account_split))


@lru_cache(maxsize=4096)
def _split(num_layers: int, pp: int, first: int | None, last: int | None, accounted: bool) -> StageSplit:
    """Layers per stage (cached: the planner asks for the same few splits many times)."""
    return accounted_split(num_layers, pp) if accounted else stage_split(num_layers, pp, first, last)


def grad_accum_steps(spec: Spec, layout: Layout) -> int:
    """Micro-batches per optimizer step per data-parallel rank (exact: the batch rule holds)."""
    per_step = layout.micro_batch_size * layout.dp
    assert spec.training.global_batch_size % per_step == 0, "batch rule must pass first"
    return spec.training.global_batch_size // per_step


def padded_vocab_size(vocab_size: int, tp: int, divisible_by: int = 128) -> int:
    """Vocabulary padded to a multiple of divisible_by * tp, as Megatron-LM does."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


def _known(*values) -> bool:
    return None not in values


# --- rules on the model alone -------------------------------------------------------------------

def rule_hidden_heads(spec: Spec, lay: Layout) -> Problem | None:
    m = spec.model
    if m.kv_channels is None and m.hidden_size % m.num_attention_heads:
        return Problem("model.hidden_size", f"hidden_size({m.hidden_size}) % num_attention_heads"
                       f"({m.num_attention_heads}) = {m.hidden_size % m.num_attention_heads}, must be 0",
                       "pick a hidden size that is a multiple of the head count, or set model.kv_channels "
                       "(the per-head dimension)")
    return None


def rule_groups_heads(spec: Spec, lay: Layout) -> Problem | None:
    m = spec.model
    if m.num_attention_heads % m.num_query_groups:
        return Problem("model.num_query_groups", f"num_attention_heads({m.num_attention_heads}) % "
                       f"num_query_groups({m.num_query_groups}) != 0", "use a divisor of the head count")
    return None


# --- rules on the layout ------------------------------------------------------------------------

def rule_world_size(spec: Spec, lay: Layout) -> Problem | None:
    world = spec.world_size
    tp, pp, dp = lay.tp, lay.pp, spec.parallelism.data
    cp = lay.cp if lay.cp is not None else spec.parallelism.context
    cps, cpt = (f" * cp({cp})", "/cp") if cp and cp > 1 else ("", "")
    if _known(tp, pp, dp, cp) and tp * cp * pp * dp != world:
        return Problem(FIELD_PATHS["dp"], f"tp({tp}){cps} * pp({pp}) * dp({dp}) = {tp * cp * pp * dp} != "
                       f"world_size({world}) = num_nodes({spec.cluster.num_nodes}) * "
                       f"gpus_per_node({spec.cluster.gpus_per_node})",
                       f"remove parallelism.data to derive it, or change tp/pp{cpt}/nodes")
    if _known(tp, pp) and world % (tp * pp * (cp or 1)):
        mp = tp * pp * (cp or 1)
        return Problem(FIELD_PATHS["pp"], f"world_size({world}) % (tp({tp}){cps} * pp({pp}) = {mp}) = "
                       f"{world % mp}, must be 0", f"make tp{cps and ' * cp'} * pp a divisor of the GPU count")
    for name, value in (("tp", tp), ("pp", pp), ("dp", dp), ("cp", cp)):
        if value is not None and world % value:
            return Problem(FIELD_PATHS[name], f"{name}({value}) does not divide world_size({world})",
                           f"use a divisor of {world}")
    return None


def rule_heads_tp(spec: Spec, lay: Layout) -> Problem | None:
    a = spec.model.num_attention_heads
    if _known(lay.tp) and a % lay.tp:
        return Problem(FIELD_PATHS["tp"], f"num_attention_heads({a}) % tp({lay.tp}) = {a % lay.tp}, must be 0",
                       "use a tensor-parallel degree that divides the head count")
    return None


def rule_groups_tp(spec: Spec, lay: Layout) -> Problem | None:
    g = spec.model.num_query_groups
    if _known(lay.tp) and g % lay.tp:
        return Problem(FIELD_PATHS["tp"], f"num_query_groups({g}) % tp({lay.tp}) = {g % lay.tp}, must be 0",
                       "use a tensor-parallel degree that divides the KV-head count")
    return None


def rule_layers_pp(spec: Spec, lay: Layout) -> Problem | None:
    """Even split (neither stage count given): num_layers % pp, then % (pp * vpp) with interleaving."""
    n = spec.model.num_layers
    if not _known(lay.pp) or lay.is_uneven or lay.account_split:
        return None
    if lay.account_split is None and engine_of(spec) == "megatron" and accounted_split(n, lay.pp) is not None:
        return None   # undecided: the planner may count the embedding and the loss in the split
    issue = even_split_issue(n, lay.pp)
    if issue is not None:
        return _split_problem(issue)
    if _known(lay.vpp) and lay.vpp > 1 and n % (lay.pp * lay.vpp):
        return Problem(FIELD_PATHS["vpp"], f"num_layers({n}) % (pp({lay.pp}) * vpp({lay.vpp}) = "
                       f"{lay.pp * lay.vpp}) = {n % (lay.pp * lay.vpp)}, must be 0",
                       "use a virtual pipeline size that splits each stage's layers evenly")
    return None


_SPLIT_PATHS = {"first": FIELD_PATHS["first_stage_layers"], "last": FIELD_PATHS["last_stage_layers"],
                "pp": FIELD_PATHS["pp"], "vpp": FIELD_PATHS["vpp"]}


def _split_problem(issue: SplitIssue) -> Problem:
    return Problem(_SPLIT_PATHS[issue.field], issue.message, issue.hint)


def rule_account_split(spec: Spec, lay: Layout) -> Problem | None:
    """--account-for-embedding/loss-in-pipeline-split: Megatron only, alone, (num_layers + 2) % pp == 0 and,
    interleaved, ((num_layers + 2) / pp) % vpp == 0 (Megatron-LM's own arithmetic)."""
    if not lay.account_split:
        return None
    path, n = FIELD_PATHS["account_split"], spec.model.num_layers
    if engine_of(spec) != "megatron":
        return Problem(path, "account_for_embedding_loss is Megatron's split; it needs training.engine megatron",
                       "set training.engine: megatron, or account_for_embedding_loss: false")
    if lay.is_uneven:
        return Problem(path, "account_for_embedding_loss cannot be combined with first_stage_layers / "
                       "last_stage_layers (Megatron-LM refuses both together)", "keep one of the two")
    if not _known(lay.pp):
        return None
    if accounted_split(n, lay.pp) is None:
        return Problem(path, f"num_layers({n}) + 2 (embedding and loss) = {n + 2} % pp({lay.pp}) = "
                       f"{(n + 2) % lay.pp if lay.pp else 0}, must be 0 with pp >= 2 and >= 2 per stage",
                       "use a pipeline size that divides num_layers + 2, or account_for_embedding_loss: false")
    c = (n + 2) // lay.pp
    if _known(lay.vpp) and lay.vpp > 1 and c % lay.vpp:
        return Problem(FIELD_PATHS["vpp"], f"(num_layers({n}) + 2) / pp({lay.pp}) = {c} per stage % "
                       f"virtual_pipeline({lay.vpp}) = {c % lay.vpp}, must be 0",
                       f"use a virtual pipeline size that divides {c}")
    return None


def rule_stage_layers(spec: Spec, lay: Layout) -> Problem | None:
    """Uneven split (first_stage_layers / last_stage_layers given): Megatron-LM's rules (see stages.py),
    the first that fails. Needs pp known; the vpp part waits for vpp."""
    if not lay.is_uneven or not _known(lay.pp):
        return None
    issues = split_issues(spec.model.num_layers, lay.pp, lay.vpp if _known(lay.vpp) else 1,
                          lay.first_stage_layers, lay.last_stage_layers)
    return _split_problem(issues[0]) if issues else None


def rule_vpp_needs_pp(spec: Spec, lay: Layout) -> Problem | None:
    """Interleaving is Megatron's schedule: DeepSpeed's pipeline engine has none. Megatron-LM core_v0.16.1
    runs it from pp = 2 with its default p2p overlap (--overlap-p2p-communication; pp > 2 only without)."""
    if not (_known(lay.vpp) and lay.vpp > 1):
        return None
    if engine_of(spec) == "deepspeed":
        return Problem(FIELD_PATHS["vpp"], f"virtual_pipeline({lay.vpp}) needs training.engine megatron: "
                       "DeepSpeed's pipeline engine has no interleaved schedule",
                       "set virtual_pipeline: 1, or training.engine: megatron")
    if _known(lay.pp) and lay.pp < 2:
        return Problem(FIELD_PATHS["vpp"], f"virtual_pipeline({lay.vpp}) needs pipeline >= 2, got pp({lay.pp})",
                       "set virtual_pipeline: 1, or pipeline >= 2 (Megatron's interleaved schedule)")
    return None


def engine_of(spec: Spec) -> str:
    """training.engine, resolved (a spec built without parse_spec may leave it None)."""
    return spec.training.engine or default_engine(spec.cluster.gpu)


def rule_vpp_microbatches(spec: Spec, lay: Layout) -> Problem | None:
    if not _known(lay.vpp, lay.pp, lay.dp, lay.micro_batch_size) or lay.vpp == 1:
        return None
    b = spec.training.global_batch_size
    per = lay.micro_batch_size * lay.dp
    if b % per == 0 and (b // per) % lay.pp:
        return Problem(FIELD_PATHS["vpp"], f"interleaving needs num_microbatches({b // per}) % pp({lay.pp}) == 0",
                       "change global_batch_size or micro_batch_size, or set virtual_pipeline: 1")
    return None


def rule_batch(spec: Spec, lay: Layout) -> Problem | None:
    b = spec.training.global_batch_size
    mb, dp = lay.micro_batch_size, lay.dp
    if _known(mb, dp) and b % (mb * dp):
        lo = b // (mb * dp) * mb * dp
        return Problem("training.global_batch_size",
                       f"global_batch_size({b}) % (micro_batch_size({mb}) * dp({dp}) = {mb * dp}) = "
                       f"{b % (mb * dp)}, must be 0 (gradient accumulation would not be whole)",
                       f"use a multiple of {mb * dp}, e.g. " + (f"{lo} or {lo + mb * dp}" if lo else f"{mb * dp}"))
    return None


def rule_sequence_parallel(spec: Spec, lay: Layout) -> Problem | None:
    if not lay.sequence_parallel:
        return None
    if _known(lay.tp) and lay.tp == 1:
        return Problem(FIELD_PATHS["sequence_parallel"], "sequence_parallel needs tp > 1, got tp(1)",
                       "set sequence_parallel: false or tensor >= 2")
    s = spec.model.seq_length
    if _known(lay.tp) and s % lay.tp:
        return Problem(FIELD_PATHS["sequence_parallel"], f"seq_length({s}) % tp({lay.tp}) = {s % lay.tp}, "
                       "must be 0 with sequence parallelism", "use a sequence length divisible by tp")
    return None


def rule_pipeline_zero(spec: Spec, lay: Layout) -> Problem | None:
    if _known(lay.pp, lay.zero_stage) and lay.pp > 1 and lay.zero_stage >= 2:
        what = ("DeepSpeed's pipeline engine does not support" if engine_of(spec) == "deepspeed" else
                "orch runs Megatron's ZeRO-2/3 on Megatron FSDP, which it does not combine with pipeline "
                "parallelism; it does not plan")
        return Problem(FIELD_PATHS["zero_stage"], f"{what} ZeRO-{lay.zero_stage} with pp({lay.pp}) > 1",
                       "use zero_stage 0 or 1 (Megatron: the distributed optimizer) with pipeline > 1")
    return None


def rule_offload(spec: Spec, lay: Layout) -> Problem | None:
    if lay.offload == "optimizer" and _known(lay.zero_stage) and lay.zero_stage < 1:
        return Problem(FIELD_PATHS["offload"], "offload 'optimizer' needs zero_stage >= 1, got 0",
                       "set zero_stage: 1, 2 or 3, or offload: none")
    if lay.offload == "optimizer+params" and _known(lay.zero_stage) and lay.zero_stage != 3:
        return Problem(FIELD_PATHS["offload"], f"offload 'optimizer+params' needs zero_stage 3, got "
                       f"{lay.zero_stage}", "set zero_stage: 3, or offload: optimizer")
    if lay.offload not in (None, "none") and _known(lay.pp) and lay.pp > 1:
        return Problem(FIELD_PATHS["offload"], f"offload with DeepSpeed's pipeline engine (pp({lay.pp}) > 1) "
                       "is not supported", "set offload: none or pipeline: 1")
    return None


def rule_shard_degree(spec: Spec, lay: Layout) -> Problem | None:
    """Hybrid sharding on Megatron (--num-distributed-optimizer-instances = dp / shard_degree): ZeRO-3 and -2
    on Megatron FSDP, ZeRO-1 on the distributed optimizer; shard_degree > 1 divides dp (and, for MoE, the
    instances divide edp: parallel_state asserts it)."""
    s, f = lay.shard_degree, FIELD_PATHS["shard_degree"]
    if s is None:
        return None
    if s < 2:
        return Problem(f, f"shard_degree({s}) must be > 1: it is the number of ranks each shard group spreads "
                       "the model states over", "remove parallelism.shard_degree (shard over all of dp), or use 2 or more")
    if _known(lay.zero_stage) and lay.zero_stage == 0:
        return Problem(f, f"shard_degree({s}) needs ZeRO (zero_stage 1-3: the states it shards inside each group "
                       "of shard_degree ranks), got zero_stage(0): nothing is sharded",
                       "set zero_stage: 3 (or 1, 2), or remove parallelism.shard_degree")
    if engine_of(spec) != "megatron":
        return Problem(f, "shard_degree needs training.engine: megatron (its distributed optimizer instances). "
                       "DeepSpeed 0.19.8 removed MiCS (zero_optimization.mics_shard_size raises "
                       "DeepSpeedConfigError) and ZeRO++ hpZ (zero_hpz_partition_size) keeps only a secondary "
                       "copy of the parameters per group: gradients and optimizer states stay sharded over all of dp",
                       "set training.engine: megatron, or remove parallelism.shard_degree")
    if _known(lay.dp) and lay.dp % s:
        return Problem(f, f"dp({lay.dp}) % shard_degree({s}) = {lay.dp % s}, must be 0 (dp / shard_degree "
                       "replicas of the sharded states)", f"use a shard_degree that divides {lay.dp}")
    if spec.model.moe is not None and _known(lay.dp, lay.tp, lay.cp, lay.ep, lay.etp) and lay.edp % lay.replicas:
        return Problem(f, f"expert-data-parallel edp({lay.edp}) % (dp({lay.dp}) / shard_degree({s}) = "
                       f"{lay.replicas}) = {lay.edp % lay.replicas}, must be 0 (Megatron splits the expert "
                       "data-parallel group into the same number of instances)",
                       "use a larger shard_degree, or a smaller ep * etp")
    return None


def rule_pipeline_depth(spec: Spec, lay: Layout) -> Problem | None:
    if _known(lay.pp) and lay.pp > spec.model.num_layers:
        return Problem(FIELD_PATHS["pp"], f"pp({lay.pp}) > num_layers({spec.model.num_layers})",
                       "use at most one stage per layer")
    return None


def rule_cpu_precision(spec: Spec, lay: Layout) -> Problem | None:
    if spec.cluster.gpu == "cpu" and spec.training.precision == "fp16":
        return Problem("training.precision", "fp16 does not run on CPU (DeepSpeed: 'Type fp16 is not "
                       "supported on your device')", "use bf16 or fp32 on cluster.gpu: cpu")
    return None


def rule_data(spec: Spec, lay: Layout) -> Problem | None:
    if not spec.data.synthetic and not spec.data.path:
        return Problem("data.path", "data.synthetic is false but no data.path is given",
                       "set data.path to a dataset, or data.synthetic: true")
    return None


HOST_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,252}")


def rule_pdsh_hosts(spec: Spec, lay: Layout) -> Problem | None:
    hosts = spec.launch.pdsh.hosts
    for i, host in enumerate(hosts):
        if not HOST_PATTERN.fullmatch(host):
            return Problem(f"launch.pdsh.hosts[{i}]", f"{host!r} is not a host name",
                           "use letters, digits, '.', '_' and '-' (not starting with '-')")
    seen: dict[str, int] = {}
    for i, host in enumerate(hosts):
        if host.lower() in seen:      # host names are case-insensitive
            return Problem(f"launch.pdsh.hosts[{i}]", f"{host!r} is listed twice (also hosts[{seen[host.lower()]}]):"
                           " pdsh would start two nodes' ranks on one host", "list each node's host once")
        seen[host.lower()] = i
    if spec.launch.backend == "pdsh" and len(hosts) != spec.cluster.num_nodes:
        return pdsh_host_count_problem(spec)
    return None


def pdsh_host_count_problem(spec: Spec) -> Problem:
    """launch.pdsh.hosts does not list one host per node: where the hosts came from, and what to set."""
    hosts, nodes = list(spec.launch.pdsh.hosts), spec.cluster.num_nodes
    found = (f"{len(hosts)} host(s) listed ({', '.join(hosts[:4])}{', ...' if len(hosts) > 4 else ''})" if hosts
             else "no hosts listed, so pdsh would use only localhost")
    return Problem("launch.pdsh.hosts", f"{found} for cluster.num_nodes({nodes}): pdsh starts one torchrun per host",
                   f"list exactly {nodes} host names under launch.pdsh.hosts in the spec (e.g. hosts: [node1, "
                   f"node2, ...]) and run `orch generate` again, or set cluster.num_nodes: {max(len(hosts), 1)}")


MODEL_RULES: list[Callable[[Spec, Layout], Problem | None]] = [rule_hidden_heads, rule_groups_heads]
LAYOUT_RULES: list[Callable[[Spec, Layout], Problem | None]] = [
    rule_world_size, rule_heads_tp, rule_groups_tp, rule_layers_pp, rule_stage_layers, rule_account_split,
    rule_pipeline_depth,
    rule_vpp_needs_pp,
    rule_batch, rule_vpp_microbatches, rule_sequence_parallel, rule_pipeline_zero, rule_offload,
    rule_shard_degree,
]
SPEC_RULES: list[Callable[[Spec, Layout], Problem | None]] = [rule_cpu_precision, rule_data, rule_pdsh_hosts]


def require_complete(spec: Spec) -> Layout:
    """The spec's layout when every field is fixed; otherwise a SpecError naming the open fields."""
    layout = layout_from_spec(spec)
    missing = layout.open_fields()
    if missing:
        raise SpecError([Problem(FIELD_PATHS[f], "not set and no planner was asked to fill it",
                                 "set it in the spec, or run `orch plan` / `orch generate` with planning")
                         for f in missing])
    return layout
