"""checkpoint.globless: DeepSpeed finds a step's files with glob.glob on the load path unescaped, so a run
dir whose path holds glob characters is loaded through a plain-named link to it."""
from __future__ import annotations

import glob
import os

import pytest

from orchestrator.train.checkpoint import globless


@pytest.mark.parametrize("name", ["exp[1]", "sweep [lr=3e-4]"])
def test_a_path_with_glob_characters_is_loaded_through_a_plain_link(tmp_path, name):
    ckpt = tmp_path / name / "checkpoints"
    (ckpt / "global_step3").mkdir(parents=True)
    (ckpt / "global_step3" / "mp_rank_00_model_states.pt").write_bytes(b"x")
    pattern = os.path.join("{}", "global_step3", "mp_rank_*_model_states.pt")
    assert glob.glob(pattern.format(ckpt)) == []          # what DeepSpeed 0.19.8 finds there: nothing
    with globless(ckpt) as load_dir:
        assert load_dir != ckpt and load_dir.resolve() == ckpt.resolve()
        assert [os.path.basename(f) for f in glob.glob(pattern.format(load_dir))] == ["mp_rank_00_model_states.pt"]
    assert not load_dir.exists() and not load_dir.parent.exists()     # the link and its dir are gone
    assert (ckpt / "global_step3").is_dir()                          # the checkpoint itself is untouched


def test_a_plain_path_is_used_as_it_is(tmp_path):
    with globless(tmp_path / "run $(x) + y") as load_dir:
        assert load_dir == tmp_path / "run $(x) + y"
