D=$OUT; R=/tmp/r; mkdir -p $R/micro $R/prof; export OPTBOT_WHEELS_INSTALLED=1 PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/micro/nvidia-smi.txt
t0=$(date +%s)
for k in gelu norm-quant; do timeout 45 python3 benchmarks/gelu_quant_micro.py --kernel $k --before benchmarks/before_kernels --json $R/micro/$k-micro.json > $R/micro/$k-micro.txt 2>&1; echo "$k $? $(( $(date +%s) - t0 ))" >> $R/micro/steps.txt; done
tar czf $D/micro.tgz -C $R micro
RES=$R/prof OUT= MODE=compile+graph timeout 90 bash benchmarks/gpu_analyze_patch.sh qwen-image benchmarks/results/cpu-fp8-loads-first-20261206/s9.patch --quant fp8 --iters 5 > $R/prof/log.txt 2>&1; echo "prof $? $(( $(date +%s) - t0 ))" >> $R/micro/steps.txt
tar czf $D/prof.tgz -C $R prof
st=$(( 175 - ($(date +%s) - t0) )); [ $st -gt 10 ] && timeout $st python3 benchmarks/gelu_quant_micro.py --kernel swiglu --before benchmarks/before_kernels --json $R/micro/swiglu-micro.json > $R/micro/swiglu-micro.txt 2>&1; echo "swiglu $? $(( $(date +%s) - t0 ))" >> $R/micro/steps.txt
tar czf $D/micro.tgz -C $R micro
left=$(( 180 - ($(date +%s) - t0) )); [ $left -gt 20 ] && timeout $left python3 -m pytest -q -p no:cacheprovider -o addopts="" -x kernel_store/qwen-image-fp8-norm-quant/test_norm_quant.py kernel_store/qwen-image-fp8-gelu-quant/test_gelu_quant.py kernel_store/flux2-fp8-norm-quant/test_flux2_norm_quant.py kernel_store/flux2-fp8-swiglu-quant/test_swiglu_quant.py > $R/micro/kernel-tests.txt 2>&1; echo "tests $? $(( $(date +%s) - t0 ))" >> $R/micro/steps.txt
tar czf $D/micro.tgz -C $R micro
cat $R/micro/steps.txt
