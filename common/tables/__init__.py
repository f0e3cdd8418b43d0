"""Floor 2, tables: captures turned into the workbook's tables.

    kernels  the kernel table, declared once (every column, its unit and meaning); ncu rows -> its counters
    ncu_pass a sweep under ncu: the script's --ncu-target child (a marker before each point) -> one row per launch
    trace    profiler traces -> one event table; the range -> kernel join
    timeline steps -> layers -> kernels -> counters: the joined story's table; Perfetto export
    flops    FLOPs and formula bytes of every kernel class
    waterfall a request's parts that must add up to what the client measured
"""
