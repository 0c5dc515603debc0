"""llama.cpp's source tree and the tools the image-chat comparison needs, built for this CPU.

    python3 scripts/llama_cpp_tree.py      # prints the tree's path, fetching and building what is missing

The tree is the llama.cpp that PyPI's llama-cpp-python 0.3.36 source package vendors (vendor/llama.cpp: the same
source .venv-llamacpp's bindings and .ci/run's tokenizer suite come from), unpacked into .build-llamacpp/llama.cpp
(git-ignored) unless $LLAMA_CPP names another; llama-mtmd-cli and llama-quantize are built there with cmake
(Release, GGML_NATIVE=ON: the kernels of this CPU, as a user building it here gets), once.
"""
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SDIST_URL = ("https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/"
             "llama_cpp_python-0.3.36.tar.gz")
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
TOOLS = ["llama-mtmd-cli", "llama-quantize"]


def source_tree():
    tree = os.environ.get("LLAMA_CPP") or os.path.join(ROOT, ".build-llamacpp", "llama.cpp")
    if os.path.isfile(os.path.join(tree, "CMakeLists.txt")):
        return tree
    print(f"fetching llama.cpp's source into {tree}", file=sys.stderr, flush=True)
    data = urllib.request.urlopen(SDIST_URL).read()
    if hashlib.sha256(data).hexdigest() != SDIST_SHA256:
        sys.exit("llama_cpp_python-0.3.36.tar.gz: unexpected sha256")
    prefix = "llama_cpp_python-0.3.36/vendor/llama.cpp/"
    os.makedirs(tree, exist_ok=True)
    with tempfile.TemporaryFile() as file:
        file.write(data)
        file.seek(0)
        with tarfile.open(fileobj=file) as archive:
            members = []
            for member in archive.getmembers():
                if member.name.startswith(prefix) and (member.isfile() or member.isdir()):
                    member.name = member.name[len(prefix):]
                    members.append(member)
            archive.extractall(tree, members=members, filter="data")
    return tree


def tool(tree, name):
    return os.path.join(tree, "build", "bin", name)


def built_tree():
    """The tree, with TOOLS built."""
    tree = source_tree()
    if all(os.access(tool(tree, name), os.X_OK) for name in TOOLS):
        return tree
    print("building llama.cpp's llama-mtmd-cli and llama-quantize (several minutes)", file=sys.stderr, flush=True)
    build = os.path.join(tree, "build")
    subprocess.run(["cmake", "-S", tree, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
                    "-DLLAMA_CURL=OFF"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", build, "--target", *TOOLS, "-j", str(os.cpu_count() or 2)], check=True,
                   stdout=subprocess.DEVNULL)
    return tree


if __name__ == "__main__":
    print(built_tree())
