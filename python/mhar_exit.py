"""What the exit of mhar's Python commands means, shared by mhar-verify (mhar_verify.py) and
python/bench_step.py: mhar-toy's exit codes for OS errors and Ctrl-C, and standard output
checked before a command exits. Imports neither torch nor numpy (the verify harness runs
without torch). mhar-train-ddp keeps its own copy of USAGE_ERRNOS, so that the mhar_torch
package stands alone."""

import errno
import os
import signal
import sys
from typing import Callable, List, Optional

# A file or folder the user named that cannot be read or written (missing, no permission,
# read-only) is unusable input (exit 2); any other OS error, a full disk included, is a failure
# (exit 1): as mhar-toy (tools/mhar_toy.cpp, exit_code_of).
USAGE_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR,
                errno.EISDIR, errno.EEXIST)

# A write that lost data: a full disk or quota, a file size limit, a device error.
_LOST = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO)

EXIT_FAILURE, EXIT_INTERRUPTED = 1, 130


def command_exit(prog: str, main: Callable[[Optional[List[str]]], int],
                 argv: Optional[List[str]] = None, interrupted: str = "") -> int:
    """main(argv)'s exit code, as mhar-toy's, once standard output is flushed.
    - A write there that failed lost what the command printed, which must not read as success:
      one line on stderr and exit 1, not a traceback, nor Python's "Exception ignored" and exit
      120 when only the flush at exit fails. Only an error without a file name is taken for
      standard output's: the commands' own files are opened by name, and report their errors
      themselves.
    - Ctrl-C: one line, "PROG: interrupted (Ctrl-C)" and `interrupted` (what is left), exit 130,
      not a traceback.
    - A pipe closed by its reader (`| head`) ends the command at once and silently, by SIGPIPE,
      as mhar-toy and every Unix filter: Python ignores SIGPIPE, which made each write there a
      BrokenPipeError and its traceback."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        code = main(argv)
        sys.stdout.flush()
        return code
    except KeyboardInterrupt:
        print("\n%s: interrupted (Ctrl-C)%s" % (prog, interrupted), file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as e:
        if e.errno not in _LOST or e.filename is not None:
            raise
        print("%s: error: writing the output (standard output) failed: %s; it is incomplete"
              % (prog, e.strerror or e), file=sys.stderr)
        # what is still buffered would fail again when Python flushes it at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILURE
