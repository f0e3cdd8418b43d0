"""The SGLang pipeline's steps, as data (run by common/pipeline.py behind 06_full_pipeline.sh).

Default (--quick / --all): 00 01 02 03 08 (the joined execution story), and 07_tp_scaling with --all
when >= 2 GPUs are visible. The flags mean what they mean in every system: --nsys adds the timeline
step (04_nsys_profile: Nsight Systems, or the torch profiler where nsys is not usable); --ncu adds the
Nsight Compute passes (05_ncu_attention, and 08's counters phase: every kernel of a layer on the counters).
"""
from common.pipeline import ONLY, Step

# what an SGLang server with the flashinfer backend compiles for Llama head_dim 128, bf16, int32 indices:
# paged prefill and tensor-core decode (fa2), the ragged prefill (backend "auto": fa3 on sm90), merge_state, norm
SERVER = ("fi:prefill_fa2", "fi:prefill_fa3", "fi:cascade", "fi:norm")

STEPS = [
    Step("00_check_env", "00_check_env.py"),
    Step("01_baseline_perf", "01_baseline_perf.py", jit=SERVER),
    Step("02_radix_cache_analysis", "02_radix_cache_analysis.py", jit=SERVER),
    Step("03_backend_comparison", "03_backend_comparison.py", jit=SERVER),
    Step("08_execution_story", "08_execution_story.py", ncu=("--ncu",), jit=SERVER),
    Step("04_nsys_profile", "04_nsys_profile.py", nsys=ONLY, jit=SERVER),
    Step("05_ncu_attention", "05_ncu_attention.py", ncu=ONLY, jit=SERVER),
    Step("07_tp_scaling", "07_tp_scaling.py", only_all=True, min_gpus=2, jit=SERVER),
]
NOTES = {}
