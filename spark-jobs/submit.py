"""What spark-submit runs: `spark-submit [options] .../automq/spark/submit.py ingest|compact ...`.

spark-submit needs a Python file as its application, not a module name; the CronJobs the
operator renders (automq.operator.sparkjobs) name this file's path in the spark image. The
arguments are those of `automq spark ...`; the session joins the JVM spark-submit started,
with its --master and --driver-memory.
"""

from __future__ import annotations

from automq.spark.cli import spark_app

if __name__ == "__main__":
    spark_app(prog_name="automq spark")
