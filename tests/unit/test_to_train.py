"""Days and cost to train: training.total_tokens and cluster.gpu_hour_cost through the spec, the plan's table,
explanation and --json; without them nothing changes."""
from __future__ import annotations

import json

import pytest
import yaml

from orchestrator.cli.plan import COLUMNS, columns_for, render_plan
from orchestrator.estimate.to_train import short_amount, to_train
from orchestrator.planner import search
from orchestrator.spec import spec_to_data
from orchestrator.spec_loader import load_spec, parse_spec
from orchestrator.userfiles import parse_yaml
from tests.conftest import EXAMPLES
from tests.unit.test_cli_plan import run_cli

EXAMPLE = EXAMPLES / "llama3-8b-64xh100.yaml"


def _write(tmp_path, training=None, cluster=None, name="cost.yaml"):
    data = yaml.safe_load(EXAMPLE.read_text())
    data["training"].update(training or {})
    data["cluster"].update(cluster or {})
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def costed(tmp_path_factory):
    """(spec, search result) of the 8B example with 1T tokens at 2.5 USD per GPU-hour."""
    path = _write(tmp_path_factory.mktemp("cost"), {"total_tokens": 1.0e12},
                  {"gpu_hour_cost": {"amount": 2.5, "currency": "USD"}})
    spec = load_spec(path)
    return spec, search(spec, top_k=5)


def test_closed_form():
    t = to_train(1e12, 1e6, 64, 0.1, (2.5, "EUR"))
    assert t["time_to_train_s"] == pytest.approx(1e6)
    assert t["days"] == pytest.approx(1e6 / 86400)
    assert t["gpu_hours"] == pytest.approx(64 * 1e6 / 3600)
    assert (t["days_low"], t["days_high"]) == pytest.approx((0.9 * 1e6 / 86400, 1.1 * 1e6 / 86400))
    cost = t["cost"]
    assert cost["amount"] == pytest.approx(2.5 * 64 * 1e6 / 3600) and cost["currency"] == "EUR"
    assert (cost["low"], cost["high"]) == pytest.approx((0.9 * cost["amount"], 1.1 * cost["amount"]))
    assert "cost" not in to_train(1e12, 1e6, 64, 0.1)        # no price: days only


def test_short_amount():
    assert [short_amount(v) for v in (812, 49_240, 1_234_567, 999_600, 2.5e9, 1e12)] == \
        ["812", "49.2k", "1.23M", "1M", "2.5B", "1T"]


def test_spec_fields_parse_and_default_to_absent(tmp_path):
    spec = load_spec(_write(tmp_path, {"total_tokens": 2e12}, {"gpu_hour_cost": {"amount": 3, "currency": "EUR"}}))
    assert spec.training.total_tokens == 2e12
    assert (spec.cluster.gpu_hour_cost.amount, spec.cluster.gpu_hour_cost.currency) == (3.0, "EUR")
    plain = load_spec(EXAMPLE)
    assert plain.training.total_tokens is None and plain.cluster.gpu_hour_cost is None
    data = spec_to_data(plain)          # absent fields stay out of spec.resolved.yaml and the spec hash
    assert "total_tokens" not in data["training"] and "gpu_hour_cost" not in data["cluster"]


def test_spec_md_exponent_notation_is_a_number():
    """SPEC.md writes `total_tokens: 1.0e12`; YAML 1.1 (PyYAML) would read a string, orch reads YAML 1.2's number."""
    assert parse_yaml("total_tokens: 1.0e12\nb: 1e12\nc: 2.5E-3\nd: 1e\n", "x") == \
        {"total_tokens": 1e12, "b": 1e12, "c": 2.5e-3, "d": "1e"}


@pytest.mark.parametrize("training, cluster, field", [
    ({"total_tokens": 0}, {}, "training.total_tokens"),
    ({"total_tokens": -5e9}, {}, "training.total_tokens"),
    ({"total_tokens": "lots"}, {}, "training.total_tokens"),
    ({}, {"gpu_hour_cost": {"amount": 0, "currency": "USD"}}, "cluster.gpu_hour_cost.amount"),
    ({}, {"gpu_hour_cost": {"amount": 2.5, "currency": "usd"}}, "cluster.gpu_hour_cost.currency"),
    ({}, {"gpu_hour_cost": {"amount": 2.5, "currency": "DOLLAR"}}, "cluster.gpu_hour_cost.currency"),
    ({}, {"gpu_hour_cost": {"amount": 2.5}}, "cluster.gpu_hour_cost.currency"),
    ({}, {"gpu_hour_cost": 2.5}, "cluster.gpu_hour_cost"),
])
def test_bad_values_exit_2_naming_the_field(tmp_path, capsys, training, cluster, field):
    code, out, err = run_cli(["plan", str(_write(tmp_path, training, cluster))], capsys)
    assert code == 2 and out == ""
    assert f":{field}" in err and "Traceback" not in err


def test_json_carries_days_and_cost_per_candidate(costed):
    spec, result = costed
    data = result.to_dict()
    assert data["chosen"] == data["candidates"][0]
    for layout in data["candidates"]:
        t = layout["to_train"]
        e = layout["uncertainty"]["relative_error"]
        assert t["total_tokens"] == 1e12 and t["num_gpus"] == 64
        assert t["time_to_train_s"] == pytest.approx(1e12 / layout["tokens_per_s"])
        assert t["days"] == pytest.approx(t["time_to_train_s"] / 86400)
        assert (t["days_low"], t["days_high"]) == pytest.approx((t["days"] * (1 - e), t["days"] * (1 + e)))
        assert t["cost"]["amount"] == pytest.approx(64 * t["time_to_train_s"] / 3600 * 2.5)
        assert t["cost"]["currency"] == "USD"
        assert t["cost"]["low"] < t["cost"]["amount"] < t["cost"]["high"]


def test_table_and_explanation_show_days_and_cost_within_the_width(costed):
    spec, result = costed
    for width in (80, 100):
        text = render_plan(spec, result, width=width)
        assert max(len(line) for line in text.splitlines()) <= width
        header = next(line for line in text.splitlines() if line.startswith("#"))
        # at 80 columns a long layout label among the top five (44 characters with cp and offload) leaves room
        # for the first priority column only; the cost column follows at 100
        assert "days" in header and ("cost USD" in header or width < 100)
        chosen = result.chosen.to_train
        assert f"{chosen['days']:.3g} days ±" in text and f"{short_amount(chosen['cost']['amount'])} USD ±" in text
        row = next(line for line in text.splitlines() if line.startswith("1 "))
        assert f"{chosen['days']:.3g}" in row.split()
        assert short_amount(chosen["cost"]["amount"]) in row.split() or width < 100
    assert "±" in render_plan(spec, result, width=100).splitlines()[1]     # the band's column fits at 100


def test_without_the_fields_nothing_changes(tmp_path, capsys):
    """Columns, JSON and text are those of a spec without the fields; a price alone adds nothing."""
    assert columns_for(load_spec(EXAMPLE)) == COLUMNS
    _, plain, _ = run_cli(["plan", str(EXAMPLE), "--json"], capsys)
    assert "to_train" not in plain
    priced = _write(tmp_path, cluster={"gpu_hour_cost": {"amount": 2.5, "currency": "USD"}})
    assert columns_for(load_spec(priced)) == COLUMNS
    _, text_plain, _ = run_cli(["plan", str(EXAMPLE)], capsys)
    _, text_priced, _ = run_cli(["plan", str(priced)], capsys)
    assert text_priced == text_plain
    assert json.loads(run_cli(["plan", str(priced), "--json"], capsys)[1]) == json.loads(plain)


def test_days_without_a_price(tmp_path):
    spec = parse_spec(yaml.safe_load(_write(tmp_path, {"total_tokens": 1e11}).read_text()))
    result = search(spec, top_k=2)
    assert "cost" not in result.chosen.to_train
    text = render_plan(spec, result, width=80)
    header = next(line for line in text.splitlines() if line.startswith("#"))
    assert "days" in header and "cost" not in header


def test_columns_follow_the_memory_total_with_their_band(tmp_path):
    spec = load_spec(_write(tmp_path, {"total_tokens": 1e12}, {"gpu_hour_cost": {"amount": 2.5, "currency": "EUR"}}))
    headers = [c.header for c in columns_for(spec)]
    at = headers.index("total GiB")
    assert headers[at + 1:at + 5] == ["days", "cost EUR", "±", "tokens/s"]
    assert sorted(headers) == sorted([c.header for c in COLUMNS] + ["days", "cost EUR"])
