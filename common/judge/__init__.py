"""Floor 3, judge: what the tables say, against hypotheses and the hardware.

    verdicts hypotheses as data, verdicts on intervals     bounds   what limits a kernel (memory, latency, compute)
    noise    run-to-run margins of judged quantities
"""
