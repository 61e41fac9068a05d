# agentrl/env-worker: `agentrl-env-worker` with the project installed, without torch
# (an environment worker only needs the broker client, the codec and the tasks).
# Built by ops/containers/build-images.sh, whose build context holds
# env-worker.requirements.txt, the project's wheel (agentrl-*.whl) and build-ca.crt (the
# CA bundle the building host trusts, used by pip when not empty).
FROM agentrl/base
RUN python3 -m venv /opt/agentrl
ENV PATH=/opt/agentrl/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
COPY build-ca.crt env-worker.requirements.txt /tmp/
RUN if [ -s /tmp/build-ca.crt ]; then export PIP_CERT=/tmp/build-ca.crt; fi \
    && pip install --no-cache-dir --disable-pip-version-check \
        -r /tmp/env-worker.requirements.txt \
    && pip install --no-cache-dir --disable-pip-version-check --no-deps bfcl-eval==2026.3.23 \
    && rm /tmp/build-ca.crt /tmp/env-worker.requirements.txt
COPY agentrl-*.whl /tmp/
RUN pip install --no-cache-dir --disable-pip-version-check --no-deps /tmp/agentrl-*.whl \
    && rm /tmp/agentrl-*.whl \
    && agentrl-env-worker --help >/dev/null \
    && python3 -c "from agentrl.environments.tasks.bfcl._bfcl import load; load()"
ENTRYPOINT ["agentrl-env-worker"]
