"""The machine a benchmark runs on, printed beside its numbers: CPU model, vector ISA, caches, and the measured fp32
FMA peak and read bandwidth of the threads the benchmark uses (reading a buffer on transparent huge pages, as
SwiftVLM holds its weights).

    python3 scripts/machine.py [--threads 2] [--json]

The benchmark scripts import `describe` and print `summary(describe(threads))` above their tables. The limits come
from scripts/machine_probe.c, compiled here for this CPU ($CC, else cc: -O2 -march=native -fopenmp) into
.build-probe/.
"""
import argparse
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE_SOURCE = os.path.join(ROOT, "scripts", "machine_probe.c")
PROBE_BINARY = os.path.join(ROOT, ".build-probe", "machine_probe")
# The instruction set extensions that decide which kernels run (oneDNN's and SwiftVLM's).
ISA_FLAGS = ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "amx_bf16", "amx_int8"]
# A buffer that fits the last-level cache of most server CPUs and one that does not.
BANDWIDTH_MB = [96, 1024]


def cpu_info():
    """Model name, vendor, family/model and ISA flags of the first CPU in /proc/cpuinfo."""
    fields = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            if not line.strip():
                break
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    flags = set(fields.get("flags", "").split())
    return {"model_name": fields.get("model name", "unknown"), "vendor": fields.get("vendor_id", "unknown"),
            "family": int(fields.get("cpu family", "0")), "model": int(fields.get("model", "0")),
            "logical_cpus": os.cpu_count(), "isa": [flag for flag in ISA_FLAGS if flag in flags]}


def caches():
    """Data and unified caches of CPU 0 as sysfs lists them: level, size, and how many CPUs share each."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    found = []
    for entry in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        if not entry.startswith("index"):
            continue

        def read(name):
            with open(os.path.join(base, entry, name)) as f:
                return f.read().strip()

        if read("type") == "Instruction":
            continue
        shared = read("shared_cpu_list")
        sharing = sum(int(b) - int(a) + 1 if "-" in part else 1
                      for part in shared.split(",") for a, _, b in [part.partition("-")])
        found.append({"level": int(read("level")), "size": read("size"), "shared_by_cpus": sharing})
    return found


def probe(threads, megabytes=BANDWIDTH_MB):
    """The FMA peak and read bandwidth of `threads` threads (a buffer of each size in `megabytes`), from the compiled
    probe."""
    if not os.path.isfile(PROBE_BINARY) or os.path.getmtime(PROBE_BINARY) < os.path.getmtime(PROBE_SOURCE):
        os.makedirs(os.path.dirname(PROBE_BINARY), exist_ok=True)
        subprocess.run([os.environ.get("CC", "cc"), "-O2", "-march=native", "-fopenmp", PROBE_SOURCE, "-o", PROBE_BINARY], check=True)
    done = subprocess.run([PROBE_BINARY, str(threads), *map(str, megabytes)], check=True, capture_output=True,
                          text=True)
    return json.loads(done.stdout)


def describe(threads):
    return {**cpu_info(), "caches": caches(), **probe(threads)}


def summary(machine):
    """Two lines for the top of a benchmark's output."""
    caches_text = ", ".join(f"L{c['level']} {c['size']}" + (f" (shared by {c['shared_by_cpus']})"
                                                             if c["shared_by_cpus"] > 1 else "")
                            for c in machine["caches"])
    bandwidth = ", ".join(f"{mb} MB {gbs:g} GB/s" for mb, gbs in machine["read_gb_per_s"].items())
    return (f"machine: {machine['model_name']} ({machine['vendor']} family {machine['family']} model "
            f"{machine['model']}, {machine['logical_cpus']} logical CPUs; {' '.join(machine['isa'])}; {caches_text})\n"
            f"measured on {machine['threads']} threads: fp32 FMA peak {machine['fma_peak_gflops']:g} GFLOP/s, "
            f"read bandwidth {bandwidth}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print the description as JSON")
    args = parser.parse_args()
    machine = describe(args.threads)
    print(json.dumps(machine, indent=2) if args.json else summary(machine))


if __name__ == "__main__":
    main()
