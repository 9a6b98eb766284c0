"""Resize a user's DeepSpeed script for real: examples/programs/ds_train.py (it knows nothing of orch) trained
by `orch launch` at ZeRO-2 (and ZeRO-3) dp 2 for 6 steps, saving at steps 4 and 6 (--save_dir), is resized from its step-4
checkpoint to 1 process and launched: the conversion step runs ds_to_universal on the script's checkpoint, the
script gets --load_dir RUN_DIR/resume/universal with a ds_config that sets checkpoint.load_universal, and
continues. Steps 5-6 are recorded once each, numbered after the source's, with the unresized run's losses
(ds_train.py's step s trains on the same global batch at any dp, so only the reduction order differs); the
source run's files stay byte-identical.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.integration.program_support import DS_TRAIN
from tests.integration.test_resize_real import _digests, _orch
from tests.integration.train_support import load_metrics

pytestmark = pytest.mark.integration
pytest.importorskip("deepspeed")

SCRIPT_ARGS = ["--steps", "6", "--save_interval", "4", "--num-layers", "2", "--hidden-size", "64",
               "--seq-length", "32", "--vocab-size", "128"]


def _launch(run: Path) -> str:
    launched = _orch("launch", str(run), "--wait")
    log = (run / "logs" / "launch.log").read_text()
    assert launched.returncode == 0, f"{launched.stderr[-3000:]}\n{log[-6000:]}"
    return log


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_a_deepspeed_script_resized_from_dp_2_to_1_continues_through_the_universal_checkpoint(zero_stage, tmp_path):
    data = yaml.safe_load((ROOT / "examples" / "ds-script-cpu.yaml").read_text())
    data["training"]["train_iters"] = 6
    data["parallelism"]["zero_stage"] = zero_stage       # ZeRO-3: ds_train.py builds under deepspeed.zero.Init
    data["program"].update(path=str(DS_TRAIN), args=SCRIPT_ARGS, save_arg="--save_dir", load_arg="--load_dir")
    data["tracking"] = {"wandb": {"mode": "disabled"}}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    source = tmp_path / "src"
    assert _orch("generate", str(spec), "-o", str(source)).returncode == 0
    _launch(source)
    expected = {r["step"]: r["loss"] for r in load_metrics(source)}
    assert sorted(expected) == list(range(1, 7))
    assert sorted(p.name for p in (source / "checkpoints").glob("global_step*")) == ["global_step4", "global_step6"]
    before = _digests(source)

    new = tmp_path / "resized"
    out = _orch("resize", str(source), "--nodes", "1", "--gpus-per-node", "1", "--step", "4", "-o", str(new))
    assert out.returncode == 0, out.stderr
    resume = json.loads((new / "resume.json").read_text())
    assert resume["program"] == "script" and resume["source_step"] == 4
    assert resume["conversion"]["method"] == "universal" and resume["conversion"]["changes"] == ["dp 2 -> 1"]

    log = _launch(new)
    universal = new / "resume" / "universal"
    assert "[orch-convert] converted" in log and (universal / "global_step4" / "zero").is_dir()
    assert f"resized run: resumes from {universal} (universal, step 4): --load_dir {universal}" in log
    states = "mp_rank_00_model_states.pt" if zero_stage < 3 else "zero_pp_rank_0_mp_rank_00_model_states.pt"
    assert f"loaded {universal}/global_step4/{states}: continuing after step 4" in log
    config = json.loads((new / "resume" / "ds_config.load_universal.json").read_text())
    assert config["checkpoint"]["load_universal"] is True
    assert "load_universal" not in (new / "ds_config.json").read_text()   # the run's own checkpoints load natively

    assert _digests(source) == before                                      # the source run is untouched
    records = load_metrics(new)
    assert [r["step"] for r in records] == [5, 6]                          # after the source's 1-4, each once
    for record in records:
        assert record["loss"] == pytest.approx(expected[record["step"]], rel=1e-3), record["step"]
    assert (new / "checkpoints" / "global_step6").is_dir()                 # it saves into its own run dir
