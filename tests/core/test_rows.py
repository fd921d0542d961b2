"""Typed rows: a CSV written by ``write_rows`` has exactly its row type's columns, an empty
cell where a row lacks one, and a row holding a key the type does not declare is refused."""

from __future__ import annotations

import csv
from typing import TypedDict

import pytest

from seqmix.io import columns, write_rows


class PointRow(TypedDict, total=False):
    x: int  # a coordinate
    y: float  # its value


def test_write_rows_writes_the_row_types_columns(tmp_path):
    out = write_rows(tmp_path / "points.csv", [{"y": 0.5, "x": 1}, {"x": 2}], PointRow)
    with open(out, newline="") as f:
        assert list(csv.reader(f)) == [["x", "y"], ["1", "0.5"], ["2", ""]]
    assert columns(PointRow) == ["x", "y"]


def test_write_rows_refuses_a_key_the_type_does_not_declare(tmp_path):
    with pytest.raises(ValueError, match=r"PointRow declares no column z: add it to .*PointRow"):
        write_rows(tmp_path / "points.csv", [{"x": 1, "y": 0.5, "z": 3}], PointRow)
    assert not (tmp_path / "points.csv").exists()
