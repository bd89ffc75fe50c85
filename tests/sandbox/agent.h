/* The command protocol between a test (the receiver) and agent.c (the sender it drives,
 * possibly under `cxrpcd run`). Fixed-size messages over a socketpair. */
#ifndef CXRPC_TESTS_SANDBOX_AGENT_H
#define CXRPC_TESTS_SANDBOX_AGENT_H
#include <stdint.h>

enum agent_op {
  AG_SEAL = 1,     /* a = addr, b = len -> r = seal id */
  AG_RELEASE,      /* a = id */
  AG_FLUSH,
  AG_CANCEL,       /* a = id */
  AG_WRITE,        /* a = addr, b = byte: a plain store inside cxr_sandbox_run */
  AG_ATTACK,       /* a = attack kind, b = addr, c = len: the attack, then a marker write */
  AG_MAP,          /* a = addr, b = len: mmap(MAP_FIXED) of the heap fd at its offset */
  AG_EXIT,
  AG_MAP_TABLE,    /* a = pid, b = fd: maps /proc/a/fd/b read-only (a table it takes) */
};

enum agent_attack {
  AT_MPROTECT = 1,      /* mprotect(PROT_READ|PROT_WRITE) of the sealed page */
  AT_PKEY_MPROTECT,     /* pkey_mprotect(..., pkey -1) */
  AT_MMAP_FIXED,        /* mmap(MAP_FIXED) of the heap file over the sealed page */
  AT_MREMAP_ALIAS,      /* mremap(p, 0, n, MAYMOVE): a second mapping, then mprotect it */
  AT_MREMAP_MOVE,       /* mremap the sealed page out of the window, then mprotect it */
  AT_MUNMAP_REMAP,      /* munmap, then mmap the heap file read-write at the same place */
  AT_MADV_REMOVE,       /* madvise(MADV_REMOVE): punch the page out of the shared file */
  AT_PROC_MEM,          /* pwrite to /proc/self/mem */
  AT_FD_MAP_OUTSIDE,    /* kept heap fd: a shared writable mapping outside the window */
  AT_FD_MAP_WINDOW,     /* kept heap fd: a shared writable mapping elsewhere in the window */
  AT_PWRITE,            /* kept heap fd: pwrite */
  AT_OPEN_PATH,         /* open the heap file by path read-write, then pwrite */
  AT_PROCESS_VM_WRITEV, /* process_vm_writev to ourselves */
  AT_PTRACE_CHILD,      /* a child attaches to us with ptrace and pokes the page */
  AT_FALLOCATE,         /* fallocate(PUNCH_HOLE) on the kept heap fd */
  AT_WRITE_TABLE,       /* make the seal table writable (mprotect, reopen) to fake "done" */
  AT_FTRUNCATE,         /* shrink the heap file (the receiver's reads would SIGBUS) */
  AT_REMAP_FILE_PAGES,  /* remap_file_pages: a writable heap page onto the sealed offset */
  AT_SHMAT_REMAP,       /* shmat(SHM_REMAP) of a SysV segment over the sealed page */
  AT_COUNT
};

typedef struct agent_msg {
  uint32_t op;
  int32_t rc;     /* reply: 0 or -errno (or a CXR_E* for seal ops) */
  uint64_t a, b, c;
  uint64_t r;     /* reply value */
} agent_msg;

#define AGENT_MARK 0xEE
#endif
