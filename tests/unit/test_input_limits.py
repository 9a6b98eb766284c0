"""Hostile or broken input (issue 13): exit 2 with the field named, never a traceback, a hang or a flag
smuggled into a generated file. The property test at the end feeds random YAML structures and bytes to
validate, plan and generate in-process."""
from __future__ import annotations

import json
import signal
from contextlib import contextmanager

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.validate.deepspeed import validate_ds_config_file
from tests.conftest import spec_data
from tests.conftest import run_cli


def _write(tmp_path, text: str, name: str = "spec.yaml"):
    path = tmp_path / name
    path.write_text(text) if isinstance(text, str) else path.write_bytes(text)
    return str(path)


# Control characters in every free-form string of the spec: a newline in data.path used to add flags to
# megatron_args.txt (one argument per line) while both validations said ok.
FREE_FORM = ["data.path", "data.tokenizer", "tracking.wandb.entity", "tracking.wandb.project",
             "tracking.wandb.group", "training.checkpoint.dir"]


@pytest.mark.parametrize("field", FREE_FORM)
@pytest.mark.parametrize("char", ["\n", "\r", "\x00", "\x1b", "\u2028"])
def test_control_characters_are_rejected(tmp_path, capsys, field, char):
    spec = _write(tmp_path, yaml.safe_dump(spec_data(**{field: f"/corpus{char}--exit-interval{char}1"})))
    code, out, _ = run_cli(["validate", spec], capsys)
    assert code == 2 and field in out and "control character" in out, out
    code, _, err = run_cli(["generate", spec, "-o", str(tmp_path / "run")], capsys)
    assert code == 2 and field in err and "control character" in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("field", ["tracking.wandb.tags", "launch.pdsh.hosts"])
def test_control_characters_in_list_items(tmp_path, capsys, field):
    spec = _write(tmp_path, yaml.safe_dump(spec_data(**{field: ["ok", "a\nb"]})))
    code, out, _ = run_cli(["validate", spec], capsys)
    assert code == 2 and f"{field}[1]" in out and "control character" in out


# (id, overrides or raw text, the field the error must name)
BAD_VALUES = [
    ("batch-1e30", {"training.global_batch_size": 10**30}, "training.global_batch_size"),
    ("layers-1e18", {"model.num_layers": 10**18}, "model.num_layers"),
    ("nodes-huge", {"cluster.num_nodes": 10**9}, "cluster.num_nodes"),
    ("world-huge", {"cluster.num_nodes": 65536, "cluster.gpus_per_node": 128}, "cluster"),
    ("seq-huge", {"model.seq_length": 10**12}, "model.seq_length"),
    ("one-beta", {"training.optimizer.betas": [0.9]}, "training.optimizer.betas"),
    ("negative-beta", {"training.optimizer.betas": [-0.1, 0.95]}, "training.optimizer.betas[0]"),
    ("beta-one", {"training.optimizer.betas": [0.9, 1.0]}, "training.optimizer.betas[1]"),
    ("seed-2**70", {"training.seed": 2**70}, "training.seed"),
    ("wandb-project-slash", {"tracking.wandb.project": "team/project"}, "tracking.wandb.project"),
    ("slurm-time-arabic-digits", {"launch.slurm.time": "\u0660\u0661:00:00"}, "launch.slurm.time"),
    ("slurm-time-999", {"launch.slurm.time": "999:99:99"}, "launch.slurm.time"),
    ("slurm-time-25h-with-days", {"launch.slurm.time": "1-25:00:00"}, "launch.slurm.time"),
    ("signal-1e20", {"launch.slurm.signal_before_end_s": 10**20}, "launch.slurm.signal_before_end_s"),
    ("signal-float", {"launch.slurm.signal_before_end_s": 1e20}, "launch.slurm.signal_before_end_s"),
]


@pytest.mark.parametrize("overrides,field", [b[1:] for b in BAD_VALUES], ids=[b[0] for b in BAD_VALUES])
@pytest.mark.parametrize("command", ["validate", "plan", "generate"])
def test_bad_values_exit_2_naming_the_field(tmp_path, capsys, overrides, field, command):
    spec = _write(tmp_path, yaml.safe_dump(spec_data(**overrides), allow_unicode=True))
    argv = [command, spec] + (["-o", str(tmp_path / "run")] if command == "generate" else [])
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and f"{field}:" in out + err, out + err


def test_slurm_time_forms_that_slurm_accepts_pass(tmp_path, capsys):
    for value in ("04:00:00", "100:00:00", "2-23:59:59"):
        spec = _write(tmp_path, yaml.safe_dump(spec_data(**{"launch.slurm.time": value})))
        assert run_cli(["validate", spec], capsys)[0] == 0, value


def _bomb() -> str:
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\nname: tiny\nmodel: {preset: *i}\n"


RAW = [
    ("deep-yaml", "name: " + "[" * 5000 + "]" * 5000, "spec.yaml", "nested more than"),
    ("deep-json", "[" * 100000 + "]" * 100000, "spec.json", "nested more than"),
    ("long-int-yaml", "name: x\ntraining: {seed: " + "9" * 5000 + "}\n", "spec.yaml", "digits"),
    ("long-int-json", '{"name": "x", "training": {"seed": ' + "9" * 5000 + "}}", "spec.json", "digits"),
    ("alias-bomb", _bomb(), "spec.yaml", "expands to more than"),
    ("duplicate-key-yaml", yaml.safe_dump(spec_data()) + "name: other\n", "spec.yaml", "duplicate key 'name'"),
    ("duplicate-key-json", json.dumps(spec_data())[:-1] + ', "name": "other"}', "spec.json", "duplicate key"),
    ("oversized", "# " + "x" * (2 << 20) + "\n" + yaml.safe_dump(spec_data()), "spec.yaml", "larger than"),
    ("not-utf8", b"name: \xff\xfe\n", "spec.yaml", "not UTF-8"),
]


@pytest.mark.parametrize("text,name,message", [r[1:] for r in RAW], ids=[r[0] for r in RAW])
@pytest.mark.parametrize("command", ["validate", "plan", "generate"])
def test_hostile_files_exit_2(tmp_path, capsys, text, name, message, command):
    spec = _write(tmp_path, text, name)
    argv = [command, spec] + (["-o", str(tmp_path / "run")] if command == "generate" else [])
    with _time_limit(20):
        code, out, err = run_cli(argv, capsys)
    assert code == 2 and message in out + err and "Traceback" not in err, (out + err)[-2000:]
    assert not (tmp_path / "run").exists()


# ds_config.json values DeepSpeed's classes accept and training breaks on.
DS = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95]}}, "gradient_clipping": 1.0}
BAD_DS = [
    ("null", "null", "must be a JSON object"),
    ("list", "[]", "must be a JSON object"),
    ("nan-clip", json.dumps({**DS, "gradient_clipping": float("nan")}), "gradient_clipping: nan is not a finite"),
    ("inf-lr", json.dumps({**DS, "optimizer": {"type": "AdamW", "params": {"lr": float("inf")}}}),
     "optimizer.params.lr: inf is not a finite"),
    ("negative-lr", json.dumps({**DS, "optimizer": {"type": "AdamW", "params": {"lr": -1e-3}}}),
     "optimizer.params.lr: -0.001 is negative"),
    ("negative-clip", json.dumps({**DS, "gradient_clipping": -1.0}), "gradient_clipping: -1.0 is negative"),
    ("one-beta", json.dumps({**DS, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9]}}}),
     "optimizer.params.betas: [0.9] is not two numbers"),
    ("deep", "[" * 100000 + "]" * 100000, "nested more than"),
    ("long-int", '{"train_batch_size": ' + "9" * 5000 + "}", "digits"),
]


@pytest.mark.parametrize("text,message", [b[1:] for b in BAD_DS], ids=[b[0] for b in BAD_DS])
def test_bad_ds_config_values_are_problems(tmp_path, text, message):
    path = tmp_path / "ds_config.json"
    path.write_text(text)
    problems = validate_ds_config_file(path, world_size=2, deep=False)
    assert any(message in str(p) for p in problems), problems


def test_good_ds_config_has_no_value_problems(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(DS))
    assert validate_ds_config_file(path, world_size=2, deep=False) == []


# --- the property: random structures and bytes, only exit 0 or 2 --------------------------------------

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20),
                    st.sampled_from(["tiny-gpt", "cpu", "fp32", "adamw", "local", "slurm", "none", "1e30"]))
KEYS = st.sampled_from(["name", "model", "cluster", "training", "parallelism", "launch", "tracking", "data",
                        "preset", "num_layers", "gpu", "global_batch_size", "tensor", "betas", "slurm", "time",
                        "wandb", "project", "seed", "x"])
STRUCTURES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                          st.dictionaries(KEYS, inner, max_size=5)), max_leaves=25)


def _mutated(data: dict, path: list[str], value) -> dict:
    node = data
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value
    return data


def _check_exit(tmp_path, capsys, text: bytes | str, name: str) -> None:
    spec = _write(tmp_path, text, name)
    out_dir = tmp_path / "run"
    for argv in (["validate", "--static", spec], ["plan", spec], ["generate", spec, "-o", str(out_dir), "--force"]):
        with _time_limit(20):
            try:
                code, out, err = run_cli(argv, capsys)
            except Exception as e:  # noqa: BLE001  (what the property forbids: anything that escapes main)
                pytest.fail(f"{argv[0]} raised {e!r} on {text[:300]!r}")
        assert code in (0, 2), (argv[0], code, (out + err)[-1500:], text[:300])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(STRUCTURES)
def test_random_yaml_structures_exit_0_or_2(tmp_path, capsys, structure):
    _check_exit(tmp_path, capsys, yaml.safe_dump(structure, allow_unicode=True), "spec.yaml")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(["model", "model.preset", "training", "training.optimizer", "cluster", "parallelism",
                                 "launch.slurm", "tracking.wandb", "data", "name", "training.global_batch_size",
                                 "model.num_layers", "parallelism.tensor", "training.optimizer.betas"]),
                min_size=1, max_size=3), STRUCTURES)
def test_random_values_in_a_valid_spec_exit_0_or_2(tmp_path, capsys, paths, value):
    data = spec_data()
    for dotted in paths:
        data = _mutated(data, dotted.split("."), value)
    _check_exit(tmp_path, capsys, yaml.safe_dump(data, allow_unicode=True), "spec.yaml")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300), st.sampled_from(["spec.yaml", "spec.json"]))
def test_random_bytes_exit_0_or_2(tmp_path, capsys, blob, name):
    _check_exit(tmp_path, capsys, blob, name)


@contextmanager
def _time_limit(seconds: int):
    """Fail (instead of hanging CI) when a command runs longer than ``seconds``."""
    def expired(*_):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# --- the property for the files of measured numbers (issue 21): doctor.json, calib.json, metrics.jsonl and
# W&B offline logs, through every command that reads them ------------------------------------------------------

NUMBERS = st.one_of(st.floats(), st.integers(), st.sampled_from([10**30, 10**400, -(10**25), 2**63, 0, -1, 1e308]),
                    st.booleans(), st.none(), st.text(max_size=6), st.lists(st.floats(), max_size=2),
                    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
DOCTOR = {"doctor_version": 1, "backend": "local", "time_unix": 0.0,
          "spec": {"gpu": "cpu", "precision": "fp32", "gpus_per_node": 2, "num_nodes": 1},
          "measured": {"gemm_flops": 1e11, "intra_node_bandwidth_GBps": 2.0, "allreduce_latency_s": 1e-4,
                       "allreduce_latency_ranks": 2}}
CALIB = {"calibration_version": 1, "cluster": {"gpu": "cpu", "gpus_per_node": 2, "precision": "fp32"},
         "cost_model": {"matmul_efficiency": 0.5, "attention_efficiency": 0.5, "kernel_gap_s": 1e-5,
                        "dp_overlap": 0.5, "intra_node_efficiency": 0.8}, "fit": {}}
RECORD_KEYS = ["step", "step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "bubble_fraction", "allreduce_time_s",
               "allreduce_overhead", "comm_exposed_s", "mem_peak_bytes", "compute_time_s", "alltoall_time_s",
               "moe_aux_loss", "x"]
FILE_SETTINGS = settings(max_examples=25, deadline=None,
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _paths_of(data: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in data.items():
        out.append(f"{prefix}{key}")
        if isinstance(value, dict):
            out += _paths_of(value, f"{prefix}{key}.")
    return out


def _mutations(base: dict):
    return st.lists(st.tuples(st.sampled_from(_paths_of(base) + ["extra", "measured.extra", "cost_model.x"]),
                              st.one_of(NUMBERS, STRUCTURES)), min_size=1, max_size=3)


def _apply(base: dict, mutations) -> str:
    import copy

    data = copy.deepcopy(base)
    for dotted, value in mutations:
        data = _mutated(data, dotted.split("."), value)
    return json.dumps(data)


def _exits_0_or_2(capsys, argv: list[str], what) -> str:
    with _time_limit(30):
        try:
            code, out, err = run_cli(argv, capsys)
        except Exception as e:  # noqa: BLE001  (what the property forbids: anything that escapes main)
            pytest.fail(f"{argv[0]} raised {e!r} on {str(what)[:300]!r}")
    assert code in (0, 2), (argv, code, (out + err)[-1500:], str(what)[:300])
    assert "NaN" not in out and "Infinity" not in out, out[-500:]
    return out


@pytest.fixture(scope="module")
def measured_inputs(tmp_path_factory):
    """A spec and a trained run dir (synthetic metrics) of it."""
    from tests.unit.compare_support import make_run_dir, steady

    root = tmp_path_factory.mktemp("measured")
    spec = root / "spec.yaml"
    spec.write_text(yaml.safe_dump(spec_data()))
    return {"spec": str(spec), "run": make_run_dir(root / "run", steady(6, 0.1))}


def _check_number_file(tmp_path, capsys, spec: str, option: str, content: str | bytes, generate: bool) -> None:
    path = tmp_path / "input.json"
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    _exits_0_or_2(capsys, ["plan", spec, option, str(path), "--json"], content)
    if generate:
        _exits_0_or_2(capsys, ["generate", spec, option, str(path), "-o", str(tmp_path / "run"), "--force"], content)
        plan = tmp_path / "run" / "plan.json"
        assert not plan.exists() or "NaN" not in plan.read_text() and "Infinity" not in plan.read_text()


@FILE_SETTINGS
@given(_mutations(DOCTOR))
def test_random_doctor_json_exit_0_or_2(tmp_path, capsys, measured_inputs, mutations):
    _check_number_file(tmp_path, capsys, measured_inputs["spec"], "--measured", _apply(DOCTOR, mutations), True)


@FILE_SETTINGS
@given(_mutations(CALIB))
def test_random_calib_json_exit_0_or_2(tmp_path, capsys, measured_inputs, mutations):
    _check_number_file(tmp_path, capsys, measured_inputs["spec"], "--calibration", _apply(CALIB, mutations), True)


@FILE_SETTINGS
@given(st.sampled_from(["--measured", "--calibration"]),
       st.one_of(st.binary(max_size=300), STRUCTURES.map(json.dumps)))
def test_random_bytes_as_doctor_or_calib_json_exit_0_or_2(tmp_path, capsys, measured_inputs, option, content):
    _check_number_file(tmp_path, capsys, measured_inputs["spec"], option, content, False)


def _record_line(base: dict):
    return st.one_of(
        st.lists(st.tuples(st.sampled_from(RECORD_KEYS), NUMBERS), max_size=3).map(
            lambda changes: json.dumps({**base, **dict(changes)}).encode()),
        st.binary(max_size=80), STRUCTURES.map(lambda s: json.dumps(s).encode()))


@FILE_SETTINGS
@given(st.data())
def test_random_metrics_jsonl_exit_0_or_2_in_compare_and_calibrate(tmp_path, capsys, measured_inputs, data):
    import shutil

    from tests.unit.compare_support import record

    run = tmp_path / "run"
    if not run.exists():
        shutil.copytree(measured_inputs["run"], run)
    lines = [data.draw(_record_line(record(step, 0.1))) for step in range(1, data.draw(st.integers(1, 6)) + 1)]
    (run / "metrics.jsonl").write_bytes(b"\n".join(lines) + data.draw(st.sampled_from([b"\n", b""])))
    _exits_0_or_2(capsys, ["compare", str(run), str(measured_inputs["run"]), "--json"], lines)
    _exits_0_or_2(capsys, ["calibrate", str(run), "-o", str(tmp_path / "calib.json"), "--json"], lines)
    (tmp_path / "calib.json").unlink(missing_ok=True)


@FILE_SETTINGS
@given(st.data())
def test_random_wandb_transaction_logs_exit_0_or_2(tmp_path, capsys, measured_inputs, data):
    """What wandb's reader prints for a .wandb file (`wandb leet inspect --json`), damaged at random, through
    compare and calibrate (the reader itself is replaced by these lines: a subprocess per example is slow)."""
    from orchestrator.runs import load_run

    direct = load_run(str(measured_inputs["run"]))
    spec = yaml.safe_load((measured_inputs["run"] / "spec.resolved.yaml").read_text())
    good = [{"type": "run", "run": {"config": {"update": {"spec": spec, "plan": direct.chosen}}}}] + [
        {"type": "history", "history": {"item": {"_step": i, **dict(r)}}} for i, r in enumerate(direct.records)]
    lines = [json.dumps(line) for line in good]
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(lines) - 1))
        lines[i] = data.draw(st.one_of(
            st.text(max_size=40), STRUCTURES.map(json.dumps),
            st.tuples(st.sampled_from(RECORD_KEYS), NUMBERS).map(
                lambda kv, line=good[i]: json.dumps(_mutated(json.loads(json.dumps(line)),
                                                             [line["type"]] + (["item"] if line["type"] == "history"
                                                                               else ["config", "update", "spec"]) +
                                                             [kv[0]], kv[1])))))
    text = "\n".join(lines)
    offline = tmp_path / "wandb" / "offline-run-20260101_000000-abc"
    offline.mkdir(parents=True, exist_ok=True)
    (offline / "run-abc.wandb").write_bytes(b"")
    import orchestrator.runs as runs_module

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runs_module, "read_wandb_offline", lambda source, path: runs_module.parse_transaction_log(text))
        _exits_0_or_2(capsys, ["compare", str(offline), "--json"], text)
        _exits_0_or_2(capsys, ["calibrate", str(offline), "-o", str(tmp_path / "calib.json")], text)
    (tmp_path / "calib.json").unlink(missing_ok=True)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=400))
def test_random_wandb_files_through_wandbs_reader_exit_0_or_2(tmp_path, capsys, blob):
    """Damaged run-*.wandb files through wandb's own reader (a subprocess: few examples)."""
    offline = tmp_path / "wandb" / "offline-run-20260101_000000-abc"
    offline.mkdir(parents=True, exist_ok=True)
    (offline / "run-abc.wandb").write_bytes(blob)
    _exits_0_or_2(capsys, ["compare", str(tmp_path / "wandb")], blob)
