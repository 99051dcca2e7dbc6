"""What a fresh evaluator process costs on this host before it checks anything, alone and 16 at once (the gates stage
runs one process per case, 16 at a time): Python with torch and triton imported, the CUDA context and a first
matmul, and the whole process with its exit. Prints one line per process count.

    python3 reports/examples/llgemm-seed002/startup_probe.py
"""
import statistics
import subprocess
import sys
import time

CHILD = """
import time
t0 = time.perf_counter()
import torch, triton
t1 = time.perf_counter()
a = torch.ones((64, 64), device="cuda", dtype=torch.float16)
(a @ a).sum().item()
t2 = time.perf_counter()
print(f"{t1 - t0:.3f} {t2 - t1:.3f}")
"""


def main() -> None:
    for count in (1, 16):
        began = time.perf_counter()
        children = [subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True) for _ in range(count)]
        done = [child.communicate() for child in children]
        wall = time.perf_counter() - began
        failed = [err for child, (_, err) in zip(children, done) if child.returncode]
        if failed:
            sys.exit("startup_probe needs a CUDA device; a child failed: " + failed[0].strip()[-500:])
        found = [tuple(map(float, out.split())) for out, _ in done]
        imports, cuda = zip(*found)
        print(f"{count:2d} processes at once: {wall:6.2f} s wall; import torch+triton median "
              f"{statistics.median(imports):.2f} s (max {max(imports):.2f}), CUDA context and first matmul median "
              f"{statistics.median(cuda):.2f} s (max {max(cuda):.2f})", flush=True)


if __name__ == "__main__":
    main()
