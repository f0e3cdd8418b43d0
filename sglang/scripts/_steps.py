"""The SGLang pipeline's steps, as data (run by common/run/pipeline.py behind 06_full_pipeline.sh).

Default (--quick / --all): 00 01 02 03 08 (the joined execution story), and 07_tp_scaling with --all
when >= 2 GPUs are visible. The flags mean what they mean in every system: --nsys adds the timeline
step (04_nsys_profile: Nsight Systems, or the torch profiler where nsys is not usable; with nsys, the GPU's own
counters over the served timeline too); --ncu adds the Nsight Compute passes (05_ncu_attention, and 08's counters
phase: every kernel of a layer on the counters). The load that fills the KV pool is 01's (its pressure load: the
--quick pool of 32768 tokens, 2x offered at once), the round-robin over more prefixes than the pool holds 02's.

One server per configuration for the --quick pipeline: a warm SGLang server start took 91 s on a fresh H100, 69 s
of it before the scheduler process had imported torch and sglang (tests/fixtures/sglang_server_start_warm_h100.log,
_sglang.startup_breakdown), and 01, 02, 03 and 08 each started one or two. With --quick the runner starts three,
each once: "default" (the flags of _sglang.serving_flags in --quick, which 01, 02's FCFS server, 03's FlashInfer
variant and 08 compute with their default options) before 01, stopped after 08; "lpm" (the same with
--schedule-policy lpm: 02's LPM pass) before 02, stopped after it; "triton" (--attention-backend triton: 03's
Triton variant) before 03, stopped after it. All three are held services: launched when the run begins, their
schedulers held by a gate (_sgl_gate) after their imports and before they touch the GPU, each released at its own
row, when the step before it has ended and the servers still up are idle; so their imports overlap the warm-up and
the steps before their rows, and no server's GPU work overlaps a step's measurement. Where the GPU holds all three at
once (_sgl_shared.SharedServer.together_ok: a 141 GB H200 does, an 80 GB H100 does not), the first row releases all
three and waits for all of them (their GPU parts overlap each other, before any step); the later rows only confirm. An experiment whose flags
are none of these (08 where FA3 runs, or any --server-arg) starts its own and says why. With --all each script
starts its own servers, as when run alone: 01's full sweep needs SGLang's own pool size, 02 and 08 their smaller
ones.
"""
from common.run.steps import ONLY, Service, Step

# what an SGLang server with the flashinfer backend compiles for Llama head_dim 128, bf16, int32 indices:
# paged prefill and tensor-core decode (fa2), the ragged prefill (backend "auto": fa3 on sm90), merge_state, norm;
# and SGLang's own JIT kernels (common.capture.jit: activation, decode positions, fused RoPE, KV store at TP 1)
SERVER = ("fi:prefill_fa2", "fi:prefill_fa3", "fi:cascade", "fi:norm",
          "sgl:activation", "sgl:clamp_position", "sgl:fused_rope", "sgl:kvcache_2048")

SERVERS = {
    "default": Service("_sglang:SharedServer", modes=("quick",), held=True,
                       why="one server start for 01, 02, 03 and 08 instead of one or two each"),
    "lpm": Service("_sglang:SharedServer", modes=("quick",), held=True,
                   options={"settings": {"schedule_policy": "lpm"}},
                   why="02's LPM pass (the scheduling policy is a launch flag), started while the steps before run"),
    "triton": Service("_sglang:SharedServer", modes=("quick",), held=True, options={"settings": {"backend": "triton"}},
                      why="03's Triton variant (the attention backend is a launch flag), started likewise"),
}
# what every step checks first (torch with CUDA, a GPU, sglang, pandas, matplotlib): the runner checks it once
NEEDS = ("common.base.checks:require_gpu", "_sgl_facts:require_stack")

STEPS = [
    Step("00_check_env", "00_check_env.py"),
    Step("01_baseline_perf", "01_baseline_perf.py", jit=SERVER, server="default"),
    Step("02_radix_cache_analysis", "02_radix_cache_analysis.py", jit=SERVER, server=("default", "lpm")),
    Step("03_backend_comparison", "03_backend_comparison.py", jit=SERVER, server=("default", "triton")),
    Step("08_execution_story", "08_execution_story.py", ncu=("--ncu",), jit=SERVER, server="default"),
    Step("04_nsys_profile", "04_nsys_profile.py", nsys=ONLY, jit=SERVER),
    Step("05_ncu_attention", "05_ncu_attention.py", ncu=ONLY, jit=SERVER),
    Step("07_tp_scaling", "07_tp_scaling.py", only_all=True, min_gpus=2, jit=SERVER),
]
NOTES = {}
