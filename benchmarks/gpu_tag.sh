#!/usr/bin/env bash
# The GPU model as a results-folder prefix ("h200", "h100"), the rule of bot/hardware.hardware_name:
# the first word of GPU 0's name shaped like a model number. The device tool lends an H100 for an
# H200 call at times, so no script names its results folder "h200-" unless it ran on one.
name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
tag=$(grep -oE '\b[A-Z][0-9]{2,3}[A-Z]?\b' <<<"$name" | head -1 | tr 'A-Z' 'a-z')
echo "${tag:-gpu}"
