# The loads-first GPU call (session 22): micros of the edited FP8 row kernels beside their earlier copies
# (this folder), then the Qwen-Image stack with them under compile + CUDA graph, then the kernel tests.
D=$OUT; R=/tmp/r; mkdir -p $R/micro $R/prof; export OPTBOT_WHEELS_INSTALLED=1 PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/micro/nvidia-smi.txt
t0=$(date +%s)
for k in gelu norm-quant swiglu; do timeout 60 python3 benchmarks/gelu_quant_micro.py --kernel $k --before benchmarks/before_kernels --json $R/micro/$k-micro.json > $R/micro/$k-micro.txt 2>&1; echo "$k $? $(( $(date +%s) - t0 ))" >> $R/micro/steps.txt; tar czf $D/micro.tgz -C $R micro; done
st=$(( 185 - ($(date +%s) - t0) )); [ $st -gt 30 ] && RES=$R/prof OUT= MODE=compile+graph timeout $st bash benchmarks/gpu_analyze_patch.sh qwen-image benchmarks/results/cpu-fp8-loads-first-20261206/s9.patch --quant fp8 --iters 5 > $R/prof/log.txt 2>&1; echo "prof $? $(( $(date +%s) - t0 ))" >> $R/micro/steps.txt
tar czf $D/prof.tgz -C $R prof; tar czf $D/micro.tgz -C $R micro
cat $R/micro/steps.txt
