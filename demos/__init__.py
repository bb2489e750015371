"""Demo jobs built on the library, kept out of its packages: ``pipeline`` (the main job: a Spark pipeline on the
embedded store, killed and restarted mid-way, verified) and ``cas_ledger`` (``onceflow run``: CAS racers and a
fenced zombie writer on the store alone)."""
