"""The long-memory benchmark suite: control models, runs, tiers, statistics, anchors, plots (``docs/bench.md``)."""
