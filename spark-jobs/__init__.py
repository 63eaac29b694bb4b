"""Spark jobs over the object store: the `automq` data source (source.py), lake ingestion
into Iceberg (ingest.py) and object compaction (compact.py). See docs/spark.md."""
