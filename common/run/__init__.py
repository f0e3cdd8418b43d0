"""Floor 5, run: what a user starts.

    cli      argument types checked before any GPU work      results   Run: a run's folder, summary.json last
    recording --reanalyse from a recorded run                steps     a pipeline's plan
    pipeline the runner behind every 06_full_pipeline.sh     warmup    the JIT warm-up step
"""
