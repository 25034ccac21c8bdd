"""The report's data model: JSON of this schema version and of the one before it loads back."""

from __future__ import annotations

import json
import math

import pytest

from amp_compiler.core.measures import OutputAccuracy
from amp_compiler.report import SCHEMA_VERSION, PrecisionReport
from amp_compiler.report.render import render

# A report as schema version 1 wrote it: each output's accuracy with error_of_range, without value_range.
VERSION_1 = """{
 "model": "ffn.onnx",
 "summary": {
  "target": "fp16", "provider": "cuda", "nodes": 1, "nodes_by_precision": {"fp16": 1},
  "flops_total": 2048, "flops_low": 2048, "casts": 0, "cast_bytes": 0, "size_before": 4096, "size_after": 2048,
  "accuracy": [
   {"name": "y", "cosine": 0.9999876, "max_abs_error": 0.0031, "error_of_range": 0.00022, "finite": true},
   {"name": "exact", "cosine": 1.0, "max_abs_error": 0.0, "error_of_range": 0.0, "finite": true},
   {"name": "bad", "cosine": NaN, "max_abs_error": Infinity, "error_of_range": Infinity, "finite": false}
  ],
  "calibration_samples": 3, "model_runs": 0, "pinned_by_tolerance": 0, "tolerance": null, "untyped_nodes": 0
 },
 "nodes": [
  {"graph": "main", "name": "mm", "op_type": "MatMul", "domain": "", "precision": "fp16", "rule": "policy.low",
   "reason": "LOW", "input_dtypes": ["fp16", "fp16"], "output_dtypes": ["fp16"], "flops": 2048, "bytes": 512,
   "tensor_core": true, "tensor_core_note": "K=16, N=64", "casts_in": [], "casts_out": [],
   "range": {"min": -1.0, "max": 2.0, "absmax": 2.0, "underflow_share": 0.0, "subnormal_share": 0.0, "count": 64},
   "error": {"rel_l2": 0.0004, "max_abs": 0.002, "added": 0.0004}, "inserted": false}
 ],
 "warnings": [],
 "schema_version": 1
}"""


def test_a_version_1_report_loads_with_its_accuracy():
    report = PrecisionReport.from_dict(json.loads(VERSION_1))
    y, exact, bad = report.summary.accuracy
    assert y.error_of_range == pytest.approx(0.00022, rel=1e-12) and y.max_abs_error == 0.0031
    assert exact.error_of_range == 0.0 and exact.finite
    assert bad.error_of_range == math.inf and not bad.finite and math.isnan(bad.cosine)
    assert report.nodes[0].error.rel_l2 == 0.0004 and report.nodes[0].range.absmax == 2.0
    assert report.schema_version == SCHEMA_VERSION  # loaded into this version's objects, written as this version
    assert "y" in render(report, "terminal")


def test_json_keeps_error_of_range_beside_the_value_range():
    report = PrecisionReport.from_dict(json.loads(VERSION_1))
    report.summary.accuracy[0] = OutputAccuracy("y", 0.9999876, 0.0031, 14.0, True)
    data = json.loads(render(report, "json"))
    y = data["summary"]["accuracy"][0]
    assert data["schema_version"] == SCHEMA_VERSION
    assert y["value_range"] == 14.0 and y["error_of_range"] == 0.0031 / 14.0
    assert PrecisionReport.from_dict(data) == report


def test_an_unknown_schema_version_is_refused():
    data = json.loads(VERSION_1)
    data["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(ValueError, match=f"schema_version {SCHEMA_VERSION + 1}"):
        PrecisionReport.from_dict(data)


def test_an_integer_outputs_changed_values_round_trip_and_version_2_still_loads():
    report = PrecisionReport.from_dict(json.loads(VERSION_1))
    report.summary.accuracy[0] = OutputAccuracy("label", 1.0, 3.0, 9.0, True, 0.1, changed=12, values=20000)
    data = json.loads(render(report, "json"))
    label = data["summary"]["accuracy"][0]
    assert data["schema_version"] == SCHEMA_VERSION and label["changed"] == 12 and label["changed_share"] == 12 / 20000
    assert data["summary"]["accuracy"][1]["changed"] is None  # a float output
    assert PrecisionReport.from_dict(data) == report
    for entry in data["summary"]["accuracy"]:  # what version 2 wrote: no changed values
        del entry["changed"], entry["values"], entry["changed_share"]
    data["schema_version"] = 2
    assert not any(a.exact for a in PrecisionReport.from_dict(data).summary.accuracy)
    assert "12 of 20000 values (0.06%) changed" in " ".join(render(report, "terminal").split())
    assert "Changed labels" in render(report, "html") and "12 of 20000 values (0.06%)" in render(report, "html")
