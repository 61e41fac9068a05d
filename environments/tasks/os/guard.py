"""The judge's guard: what keeps a program the judge runs from reaching the judge.

A check script may run a program the agent wrote (``[ "$(/root/greet)" = hi ]``), which
then runs as a child of the judge's own shell, with its user and capabilities. `GUARD`
is the first program of every judge (``python3 -c GUARD MASK ARGV...``, the host's or
the image's interpreter, `_PYTHON`); before it ``exec``s the judge's program it:

- installs a seccomp filter, inherited by every process the judge starts, that denies
  ``ptrace``, ``process_vm_readv``, ``process_vm_writev`` and ``pidfd_getfd`` (EPERM;
  on x86_64 the x32 and i386 entry points too): nothing in the judge's process tree
  attaches to, reads or writes another process, nor takes its descriptors;
- where it holds ``CAP_SYS_ADMIN`` (the bwrap judge, given it for this only): installs
  the filter without ``no_new_privs``, drops ``CAP_SYS_ADMIN`` (and every capability
  not in ``MASK``) from its bounding set, then empties its own capability sets, so
  that the ``exec`` of the judge's program raises them again: the kernel then marks
  the judge's shell not dumpable, and a process without ``CAP_SYS_PTRACE`` (no agent
  process has it, nor anything the judge starts: ``MASK`` leaves it out) can neither
  trace it nor open its ``/proc/PID/mem``, ``environ`` or descriptors. Where it does
  not (a container's exec), ``no_new_privs`` is set instead (seccomp requires one of
  the two), and the judge's shell stays dumpable.

A ``/usr/bin/env NAME=VALUE... PROGRAM`` at the head of the judge's argv is applied here
(the assignments to the environment, ``PROGRAM`` run directly), so that the raise
happens at the ``exec`` of the judge's own interpreter. Signals need no filter: a judge
killed exits with a signal's status, which fails its check; and the bwrap backend kills
every process a judge started when it ends (its cgroup).
"""

from __future__ import annotations

__all__ = ["CAP_NUMBERS", "GUARD", "caps_mask", "guarded"]

CAP_NUMBERS = {
    "chown": 0, "dac_override": 1, "dac_read_search": 2, "fowner": 3, "fsetid": 4,
    "kill": 5, "setgid": 6, "setuid": 7, "setpcap": 8, "net_bind_service": 10,
    "net_raw": 13, "sys_chroot": 18, "sys_ptrace": 19, "sys_admin": 21, "mknod": 27,
    "audit_write": 29, "setfcap": 31,
}  # fmt: skip
"""Linux capability numbers (``linux/capability.h``) of the names the sandboxes use."""

GUARD = r"""
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
keep, argv = int(sys.argv[1], 16), sys.argv[2:]
machine = os.uname().machine
ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
DENIED = {"x86_64": (101, 310, 311, 438), "aarch64": (117, 270, 271, 438)}
if machine not in ARCH:
    sys.exit("judge guard: no seccomp filter for " + machine)
ALLOW, EPERM = 0x7FFF0000, 0x00050001
LD, JEQ, JGE, RET = 0x20, 0x15, 0x35, 0x06
prog = [(LD, 0, 0, 4), (JEQ, 1, 0, ARCH[machine]), (RET, 0, 0, EPERM), (LD, 0, 0, 0)]
if machine == "x86_64":
    prog.append((JGE, 0, 1, 0x40000000))  # x32: everything refused
    prog.append((RET, 0, 0, EPERM))
for nr in DENIED[machine]:
    prog += [(JEQ, 0, 1, nr), (RET, 0, 0, EPERM)]
prog.append((RET, 0, 0, ALLOW))
filt = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *op) for op in prog))
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
fprog = Fprog(len(prog), ctypes.addressof(filt))
def check(rc, what):
    if rc != 0:
        sys.exit("judge guard: %s failed: %s" % (what, os.strerror(ctypes.get_errno())))
with open("/proc/self/status") as f:
    eff = int([l for l in f if l.startswith("CapEff:")][0].split()[1], 16)
admin = bool(eff >> 21 & 1)
if not admin:
    check(libc.prctl(38, 1, 0, 0, 0), "no_new_privs")
check(libc.prctl(22, 2, ctypes.byref(fprog), 0, 0), "seccomp")
if admin:
    for cap in range(64):
        if not keep >> cap & 1 and libc.prctl(23, cap, 0, 0, 0) == 1:
            check(libc.prctl(24, cap, 0, 0, 0), "dropping capability %d" % cap)
    head = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)()
    check(libc.capset(head, data), "capset")
env = dict(os.environ)
for name in ("PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONSAFEPATH"):  # the guard's own
    env.pop(name, None)
if argv and argv[0] == "/usr/bin/env":
    argv = argv[1:]
    while argv and "=" in argv[0] and not argv[0].startswith("="):
        name, _, value = argv.pop(0).partition("=")
        env[name] = value
os.execve(argv[0], argv, env)
"""
"""The guard's program (module doc): ``MASK`` in hex, then the judge's argv."""


_PYTHON = (
    "/usr/bin/env", "PYTHONHOME=/usr", "PYTHONNOUSERSITE=1", "PYTHONSAFEPATH=1",
    "/usr/bin/python3", "-s",
)  # fmt: skip
"""The guard's interpreter, as `items.Script.judge_argv` runs a Python check: its home
fixed at ``/usr`` (``-I`` would ignore that, and a ``pyvenv.cfg`` the agent writes in
``/usr`` would then move its standard library), no user site, no working directory on
its path."""


def caps_mask(names: tuple[str, ...]) -> int:
    """The bit mask of capabilities ``names`` (`CAP_NUMBERS`)."""
    return sum(1 << CAP_NUMBERS[name] for name in names)


def guarded(argv: list[str], caps_mask: int) -> list[str]:
    """``argv`` (its program by absolute path) started through `GUARD`, keeping at most
    the capabilities in ``caps_mask`` (bit ``n``: capability ``n``)."""
    return [*_PYTHON, "-c", GUARD, f"{caps_mask:x}", *argv]
