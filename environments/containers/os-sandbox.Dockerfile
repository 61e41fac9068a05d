# agentrl/os-sandbox: the machine of one `os` task session (environments/tasks/os/docker_sandbox.py).
# Built by ops/containers/build-images.sh after agentrl/base (which has python3 and procps).
# What the task items use: bash and coreutils, find, grep/sed/awk, python3 (check
# scripts), useradd/groupadd/su (users and permissions), ps/pgrep/pkill/killall (processes).
FROM agentrl/base
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        bash coreutils findutils grep sed mawk passwd util-linux procps psmisc file \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
ENV LANG=C.UTF-8
WORKDIR /root
CMD ["bash"]
