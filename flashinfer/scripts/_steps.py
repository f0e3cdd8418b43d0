"""The FlashInfer pipeline's steps, as data (run by common/run/pipeline.py behind 06_full_pipeline.sh).

Default (--quick / --all): 00 01 02 03 04 05 07. --ncu adds --ncu to 02-05 (every sweep point once under
ncu -> their kernels tables) and one ncu_profile.sh pass per kernel class (summary metrics on 2 launches
in --quick, --set full on 4 in --all -> results/ncu_profile/<class>/). --nsys adds --nsys to 02 and 03:
each re-runs its sweep once under Nsight Systems and shows the kernels on a timeline (timeline.csv/.png
and the story); where nsys is not usable they say so and show the torch-profiler trace they write.
"""
from common.run.steps import ONLY, Step

# what every step checks first (torch with CUDA, a GPU, flashinfer): the runner checks it once, before any step
NEEDS = ("_fi:require_stack",)


ALL_FI = ("fi:decode", "fi:prefill_fa2", "fi:prefill_fa3", "fi:norm", "fi:rope")


def ncu_pass(kind: str, kernels: str, script: str, jit: tuple, *target: str) -> Step:
    """ncu_profile.sh over a script's --ncu-target mode (each sweep point once, a marker kernel between)."""
    app = ("--", "{python}", f"{{scripts}}/{script}", "--ncu-target", "--quick", *target)
    cc = ("--cache-control", "all")      # the sweep points are timed with a cold L2: ncu flushes it too
    return Step(f"ncu_{kind}", "ncu_profile.sh", ncu=ONLY, jit=jit,
                quick=("--name", kind, "--kernel", kernels, "--count", "2", *cc, *app),
                full=("--name", kind, "--kernel", kernels, "--set", "full", "--count", "4", *cc, *app))


STEPS = [
    Step("00_check_env", "00_check_env.py"),
    Step("01_test_kernels", "01_test_kernels.py", jit=ALL_FI),
    Step("02_profile_prefill", "02_profile_prefill.py", ncu=("--ncu",), nsys=("--nsys",),
         jit=("fi:prefill_fa2", "fi:prefill_fa3")),
    Step("03_profile_decode", "03_profile_decode.py", ncu=("--ncu",), nsys=("--nsys",), jit=("fi:decode", "fi:prefill_fa2")),
    Step("04_profile_rmsnorm", "04_profile_rmsnorm.py", ncu=("--ncu",), jit=("fi:norm",)),
    Step("05_profile_rope", "05_profile_rope.py", ncu=("--ncu",), jit=("fi:rope",)),
    # 07 compiles cold in a temporary cache of its own; the warm-up serves its "your cache" load pass
    Step("07_jit_analysis", "07_jit_analysis.py", jit=ALL_FI),
    ncu_pass("decode", "BatchDecode|MergeStates", "03_profile_decode.py", ("fi:decode",), "--variants", "cuda"),
    ncu_pass("prefill", "BatchPrefillWithPagedKVCacheKernel|PrefillWithKVCacheKernel|MergeStates",
             "02_profile_prefill.py", ("fi:prefill_fa2", "fi:prefill_fa3"), "--models", "llama-3.1-8b"),
    ncu_pass("norm", "RMSNormKernel", "04_profile_rmsnorm.py", ("fi:norm",)),
    ncu_pass("rope", "Rotary", "05_profile_rope.py", ("fi:rope",)),
]
