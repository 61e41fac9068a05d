# agentrl/os-sandbox: the machine of one `os` task session (environments/tasks/os/docker_sandbox.py).
# Built by ops/containers/build-images.sh after agentrl/base (which has python3 and procps).
# What the task items use: bash and coreutils, find, grep/sed/awk, python3 (check
# scripts), useradd/groupadd/su (users and permissions), ps/pgrep/pkill/killall (processes);
# and what AgentBench's `default` image (data/os_interaction/res/dockerfiles/default) adds
# to Ubuntu: pip, git, vim, curl, wget, unzip, zip, tree. Root's ~/.bashrc and ~/.profile
# are /etc/skel's, as Ubuntu's root has them: under TERM=xterm its prompt sets the window
# title, which is how AgentBench's terminal (and the `terminal` shell) finds the prompt.
FROM agentrl/base
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        bash coreutils findutils grep sed mawk passwd util-linux procps psmisc file \
        python3-pip git vim curl wget unzip zip tree \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \
    && cp /etc/skel/.bashrc /etc/skel/.profile /root/
ENV LANG=C.UTF-8
WORKDIR /root
CMD ["bash"]
