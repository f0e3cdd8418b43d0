"""Floor 1, capture: what runs on the machine and what it leaves on disk.

    procs    child processes in their own group, ports, pidfiles      gpu      the machine: GPUs, datasheet, provenance
    clocks   the one NVML sampler (clocks, power, memory, owners)     ceilings this GPU's measured ceilings (the record)
    probes   the probes that measure the ceilings                     timing   the one GPU timer and the rates next to it
    ncu      Nsight Compute: run it, read its raw CSV                 nsys     Nsight Systems: run it, read its tables
    ranges   NVTX ranges                                              models   dummy-weight model folders
    jit      the JIT module builders                                  store    a run's folder on disk, written whole
"""
