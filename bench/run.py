"""Run every benchmark in bench/ with its defaults; each prints its table and writes bench/results/*.json.

    python bench/run.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHMARKS = ["store_throughput.py", "kafka_throughput.py", "txn_throughput.py", "spark_sink.py"]

if __name__ == "__main__":
    here = Path(__file__).parent
    failed = [name for name in BENCHMARKS
              if subprocess.run([sys.executable, str(here / name), *sys.argv[1:]]).returncode != 0]
    sys.exit(1 if failed else 0)
