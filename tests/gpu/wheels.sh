# Sourced by the scripts run on the device machine (device-check.sh,
# bench/results/learner-step/device_learner_step.sh), from the repository root: installs
# .whl/ (agentrl's wheel and the dependencies the machine lacks) into /tmp/agentrl-site and
# puts it on PYTHONPATH. AGENTRL_GPU_WHEELS=0 skips it (a check of the scripts on a CPU).
if [ -d .whl ] && [ "${AGENTRL_GPU_WHEELS:-1}" = 1 ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/agentrl-site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/agentrl-site
fi
