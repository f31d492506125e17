"""A tiny seccomp filter that forbids creating user namespaces inside the sandbox.

When the host is root, bubblewrap runs privileged (no user namespace of its own), so it cannot
use ``--disable-userns``; this filter closes the same door: ``unshare``/``clone`` with
``CLONE_NEWUSER`` fail with EPERM, and ``clone3`` (whose flags sit in memory a filter cannot
read) fails with ENOSYS so libc falls back to ``clone``, as Docker's default profile does.
Only x86-64 is covered; elsewhere ``user_namespace_filter`` returns None.
"""

from __future__ import annotations

import errno
import platform
import struct

_AUDIT_ARCH_X86_64 = 0xC000003E
_NR = {"clone": 56, "unshare": 272, "clone3": 435}  # x86-64
CLONE_NEWUSER = 0x10000000

# classic BPF opcodes
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JSET_K = 0x45
_RET_K = 0x06
_SECCOMP_RET_ALLOW = 0x7FFF0000
_SECCOMP_RET_ERRNO = 0x00050000
_SECCOMP_RET_KILL_PROCESS = 0x80000000

# offsets in struct seccomp_data
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def user_namespace_filter() -> bytes | None:
    """The compiled filter (struct sock_filter array) for ``bwrap --seccomp``; None off x86-64."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    prog = [
        _insn(_LD_W_ABS, 0, 0, _OFF_ARCH),
        _insn(_JEQ_K, 1, 0, _AUDIT_ARCH_X86_64),
        _insn(_RET_K, 0, 0, _SECCOMP_RET_KILL_PROCESS),  # a foreign-ABI syscall: refuse outright
        _insn(_LD_W_ABS, 0, 0, _OFF_NR),
        _insn(_JEQ_K, 0, 1, _NR["clone3"]),
        _insn(_RET_K, 0, 0, _SECCOMP_RET_ERRNO | errno.ENOSYS),
        _insn(_JEQ_K, 2, 0, _NR["unshare"]),
        _insn(_JEQ_K, 1, 0, _NR["clone"]),
        _insn(_RET_K, 0, 0, _SECCOMP_RET_ALLOW),
        _insn(_LD_W_ABS, 0, 0, _OFF_ARG0),  # flags (low 32 bits)
        _insn(_JSET_K, 0, 1, CLONE_NEWUSER),
        _insn(_RET_K, 0, 0, _SECCOMP_RET_ERRNO | errno.EPERM),
        _insn(_RET_K, 0, 0, _SECCOMP_RET_ALLOW),
    ]
    return b"".join(prog)
