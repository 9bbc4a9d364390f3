"""The built-in configuration tuner: Model Analyzer's sweep of Triton's batcher settings, run on
the bound callable in process (``embedtriton tune module:function --model NAME``)::

    report = tune(server, "MyModel", concurrency=(1, 8, 32), latency_budget_ms=20)
    print(report.table())
    report.save("tuning-report")  # report.json, report.png, best_config.py
    server.load("MyModel", report.best_config)
"""

from .report import Candidate, Trial, TuningReport
from .search import tune

__all__ = ["Candidate", "Trial", "TuningReport", "tune"]
