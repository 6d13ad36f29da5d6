"""benchmarks/_spark_ceiling.py, without Spark: the ceiling side of spark_read.py yields exactly
the rows spark_read.py's ``fill`` stores (the same Parquet rows, columns and types), cut into
the partitions and batch sizes it is asked for (issue 22: "prebuilt Arrow batches of the same
rows")."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path
from types import ModuleType

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.types import StructType

BENCHMARKS = Path(__file__).resolve().parent.parent.parent / "benchmarks"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_ceiling_yields_the_rows_fill_stores(tmp_path: Path) -> None:
    spark_read, ceiling = load("spark_read"), load("_spark_ceiling")
    n = 25_003  # (three appends of fill, the last one short)
    parquet = tmp_path / "events"
    spark_read.fill(str(tmp_path / "hub"), str(parquet), n)
    stored = pq.read_table(parquet).combine_chunks()
    ranges = ceiling.split(n, 3)
    assert ranges[0][0] == 1
    assert ranges[-1][1] == n + 1
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    source = ceiling.CeilingDataSource({
        "rows": str(n), "partitions": "3", "valueBytes": str(spark_read.VALUE_BYTES),
        "perAppend": str(spark_read.PER_APPEND), "batchRows": "7000",
    })  # fmt: skip
    reader = source.reader(StructType())
    partitions = reader.partitions()
    assert len(partitions) == 3
    batches = [batch for p in partitions for batch in reader.read(p)]
    assert max(b.num_rows for b in batches) == 7_000
    again = [batch for p in partitions for batch in reader.read(p)]
    assert all(a is b for a, b in zip(batches, again, strict=True))  # built once, then held
    built = pa.Table.from_batches(batches).combine_chunks()
    assert built.schema.equals(stored.schema)
    assert built.equals(stored)
