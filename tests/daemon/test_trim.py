"""``ebctl.daemon.trim``: what glibc keeps after a burst is given back, measured by the kernel (/proc VmRSS)."""

import subprocess
import sys

import pytest

from ebctl.daemon.trim import Trimmer, malloc_trim

# In a fresh interpreter: 60,000 buffers of 1 kB (above pymalloc's 512 B, below glibc's mmap threshold: they come
# from the heap), one more kept alive above them, as a daemon's later allocations are, then all freed but that one.
BURST = """
import json
from ebctl.daemon.trim import Trimmer
def rss():
    return next(int(l.split()[1]) / 1024 for l in open("/proc/self/status") if l.startswith("VmRSS"))
r0 = rss()
xs = [bytes(1000) + bytes([i % 256]) for i in range(60000)]
top = bytes(1000) + b"x"
r1 = rss()
del xs
r2 = rss()
t = Trimmer()
t.trim()
print(json.dumps({"before": r0, "burst": r1, "freed": r2, "trimmed": rss(), "count": t.count, "s": t.last_s}))
"""


@pytest.mark.skipif(malloc_trim() is None, reason="this C library has no malloc_trim (glibc only)")
def test_a_trim_returns_what_glibc_kept_after_a_burst():
    import json
    out = json.loads(subprocess.run([sys.executable, "-c", BURST], capture_output=True, text=True, check=True).stdout)
    grown = out["burst"] - out["before"]
    assert grown > 50, out  # 60 MB of buffers
    assert out["freed"] > out["burst"] - 5, out  # freed but kept: the RSS stays up (why the trim exists)
    assert out["freed"] - out["trimmed"] > 0.8 * grown, out  # the trim gives back at least 80% of it
    assert out["count"] == 1


def test_due_once_per_interval_and_nothing_without_malloc_trim():
    calls = []
    t = Trimmer(every_s=60.0, fn=lambda: calls.append(1) or 1)
    assert t.due(100.0) and not t.due(159.9) and t.due(160.0)
    t.trim()
    assert calls == [1] and t.count == 1 and t.released == 1
    bare = Trimmer(fn=None)
    bare.fn = None  # a C library without it
    assert not bare.available and not bare.due(0.0)
    bare.trim()
    assert bare.count == 0
