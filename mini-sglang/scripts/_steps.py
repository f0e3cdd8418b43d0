"""The mini-SGLang pipeline's steps, as data (run by common/run/pipeline.py behind 06_full_pipeline.sh).

Default (--quick / --all): 00 01 02 03 04 05 07 08. 05_profile_comm needs 2 GPUs: on one the runner leaves it
out with a note (run alone, the script says so with a [skip] line). --all runs every script's full experiment, whose ncu passes are part of
it; --ncu adds them to --quick (02, 03, 04) and the counters pass of 08. --nsys runs 08_forward_timeline's eager case under Nsight
Systems too (its torch-profiler timeline where nsys is not usable).
"""
from common.run.steps import Step

# what every step checks first (torch with CUDA, tvm-ffi, mini-SGLang's kernels, a GPU): the runner checks it once
NEEDS = ("_msgl:require_gpu_stack",)


INDEX, STORE = "msgl:index_8192_s4", "msgl:store_2048"         # Llama-3.1-8B: embedding rows, KV rows (TP1)

STEPS = [
    Step("00_check_env", "00_check_env.py", jit=(INDEX, STORE, "msgl:radix")),
    Step("01_test_kernels", "01_test_kernels.py", jit=(INDEX, STORE, "msgl:store_256"),
         jit_all=("msgl:store_1024", "msgl:store_512")),
    Step("02_profile_index", "02_profile_index.py", ncu=("--ncu",), jit=(INDEX,),
         jit_all=("msgl:index_16384_s4", "msgl:index_7168_s2", "msgl:index_2048_s4", "msgl:index_8192_s1",
                  "msgl:index_8192_s2", "msgl:index_8192_s8", "msgl:index_8192_s16")),
    Step("03_profile_store", "03_profile_store.py", ncu=("--ncu",), jit=(STORE, "msgl:store_256"),
         jit_all=("msgl:store_1024", "msgl:store_512")),
    Step("04_profile_attention", "04_profile_attention.py", ncu=("--ncu",),
         jit=(STORE, "fi:prefill_fa2", "fi:decode")),     # "fi": tensor-core decode = the fa2 prefill module
    Step("05_profile_comm", "05_profile_comm.py", min_gpus=2, jit=("msgl:pynccl",)),
    Step("07_profile_radix", "07_profile_radix.py", jit=("msgl:radix",)),
    Step("08_forward_timeline", "08_forward_timeline.py", ncu=("--ncu",), nsys=("--nsys",),
         jit=(INDEX, STORE, "msgl:radix", "fi:prefill_fa2", "fi:norm", "fi:rope", "fi:silu_and_mul")),
]
