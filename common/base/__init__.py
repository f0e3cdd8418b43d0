"""Floor 0, the ground: what every floor uses and that uses no floor.

    checks   one-line errors (SetupError, require_*), the cache folder, run_main: how a process ends
    story    numbers, tables, trees and timelines as text (fmt, table, tree, fold)
    stats    percentiles and the intervals verdicts are judged on
"""
