"""Hub cache fixtures: a cache written by huggingface_hub itself, and a check of a cache written by SwiftVLM.

Run by hand from the repository root with the oracle venv (huggingface_hub comes with transformers):

    python oracle/hub_cache.py make
        Serves a small model repo (tiny-org/tiny-clip: the files of Tests/Fixtures/clip/tiny-sharded-bf16 plus a
        README) in the Hub's URL layout from a local HTTP server on 127.0.0.1, points HF_ENDPOINT at it, runs
        huggingface_hub's snapshot_download into a fresh cache and copies that cache (symlinks kept) to
        Tests/Fixtures/hub/python-cache/. Also writes Tests/Fixtures/hub/repo.json, the repo's manifest (commit,
        paths, sizes, git blob ids, LFS sha256), from which the Swift test server serves the same repo, and
        Tests/Fixtures/hub/cases.json: what huggingface_hub's filter_repo_objects and _normalize_etag, and hashlib's
        sha256, give on a few inputs.

    python oracle/hub_cache.py check-swift-cache DIR
        The reverse direction. With outgoing traffic disabled, asks huggingface_hub to find tiny-org/tiny-clip in the
        cache DIR that SwiftVLM wrote, and checks every file it finds against the manifest. To produce DIR:

            VLMHUB_EXPORT_CACHE=/tmp/swift-hub-cache swift test --filter VLMHubTests.InteropTests
            python oracle/hub_cache.py check-swift-cache /tmp/swift-hub-cache
"""
import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "Tests", "Fixtures", "hub")
SOURCE = os.path.join(ROOT, "Tests", "Fixtures", "clip", "tiny-sharded-bf16")
MANIFEST = os.path.join(FIXTURES, "repo.json")
REPO_ID = "tiny-org/tiny-clip"
README = "# tiny-clip\n\nA random-init CLIP with four bf16 shards, for SwiftVLM's Hub cache tests.\n"


def git_blob_id(data):
    """What the Hub sends as the ETag of a file stored in git: the git blob's sha1."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def build_repo():
    """path -> bytes, and the manifest describing them. Safetensors files are LFS files, as on the Hub."""
    contents = {"README.md": README.encode()}
    for name in sorted(os.listdir(SOURCE)):
        if not name.startswith("expected"):
            with open(os.path.join(SOURCE, name), "rb") as f:
                contents[name] = f.read()
    files = []
    for path, data in sorted(contents.items()):
        entry = {"path": path, "size": len(data), "blob_id": git_blob_id(data)}
        if path.endswith(".safetensors"):
            entry["sha256"] = hashlib.sha256(data).hexdigest()
        files.append(entry)
    # A stable stand-in for the commit id: the hash of the tree's contents.
    commit = hashlib.sha1(json.dumps(files, sort_keys=True).encode()).hexdigest()
    return contents, {"repo_id": REPO_ID, "branch": "main", "commit": commit, "files": files}


def serve(contents, manifest):
    """A Hub look-alike for one repo: model info, tree listing, resolve (LFS files redirect to /cdn-lfs/)."""
    commit = manifest["commit"]
    by_path = {f["path"]: f for f in manifest["files"]}
    by_sha = {f["sha256"]: f for f in manifest["files"] if "sha256" in f}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def reply(self, status, headers, body, send_body):
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if send_body:
                self.wfile.write(body)

        def handle_request(self, send_body):
            path = self.path.split("?")[0]
            api = f"/api/models/{REPO_ID}/"
            resolve = f"/{REPO_ID}/resolve/"
            if path in (api + "revision/main", api + "revision/" + commit):
                info = {"id": REPO_ID, "sha": commit, "private": False,
                        "siblings": [{"rfilename": f["path"]} for f in manifest["files"]]}
                return self.reply(200, {"Content-Type": "application/json"}, json.dumps(info).encode(), send_body)
            if path == api + "tree/" + commit:
                tree = []
                for f in manifest["files"]:
                    item = {"type": "file", "path": f["path"], "size": f["size"], "oid": f["blob_id"]}
                    if "sha256" in f:
                        item["lfs"] = {"oid": f["sha256"], "size": f["size"], "pointerSize": 134}
                    tree.append(item)
                return self.reply(200, {"Content-Type": "application/json"}, json.dumps(tree).encode(), send_body)
            if path.startswith(resolve):
                revision, _, name = path[len(resolve):].partition("/")
                entry = by_path.get(name)
                if revision not in ("main", commit) or entry is None:
                    return self.reply(404, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit}, b"", send_body)
                if "sha256" in entry:
                    return self.reply(302, {
                        "Location": "/cdn-lfs/" + entry["sha256"], "X-Repo-Commit": commit,
                        "X-Linked-Etag": '"%s"' % entry["sha256"], "X-Linked-Size": str(entry["size"]),
                        "ETag": '"%s"' % entry["blob_id"]}, b"", send_body)
                return self.reply(200, {"ETag": '"%s"' % entry["blob_id"], "X-Repo-Commit": commit},
                                  contents[name], send_body)
            if path.startswith("/cdn-lfs/") and path[len("/cdn-lfs/"):] in by_sha:
                entry = by_sha[path[len("/cdn-lfs/"):]]
                # huggingface_hub follows a same-host redirect and reads the metadata from this response.
                return self.reply(200, {"ETag": '"%s"' % entry["sha256"], "X-Repo-Commit": commit},
                                  contents[entry["path"]], send_body)
            return self.reply(404, {}, b"", send_body)

        def do_HEAD(self):
            self.handle_request(send_body=False)

        def do_GET(self):
            self.handle_request(send_body=True)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def isolate_environment(endpoint, cache_dir, offline):
    """Set before huggingface_hub is imported: it reads its constants at import time."""
    for key in list(os.environ):
        if key.startswith(("HF_", "HUGGINGFACE_")) or key in ("TRANSFORMERS_OFFLINE", "HTTP_PROXY", "HTTPS_PROXY"):
            del os.environ[key]
    os.environ.update({
        "HF_ENDPOINT": endpoint, "HF_HUB_CACHE": cache_dir, "HF_HOME": os.path.join(cache_dir, "home"),
        "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_HUB_OFFLINE": "1" if offline else "0", "NO_PROXY": "127.0.0.1",
    })


# File names of a typical transformers repo, plus names that exercise fnmatch's corners.
LISTING = [
    ".gitattributes", "README.md", "config.json", "flax_model.msgpack", "generation_config.json", "merges.txt",
    "model.safetensors", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
    "model.safetensors.index.json", "preprocessor_config.json", "pytorch_model.bin", "special_tokens_map.json",
    "tf_model.h5", "tokenizer.json", "tokenizer_config.json", "vocab.json", "onnx/model.onnx", "onnx/config.json",
    "onnx/deep/x.json", "[weird].json", "a?b.txt", "Config.JSON",
]
PATTERNS = [
    (None, None), (["*.json"], None), (["*.safetensors", "*.json"], ["onnx/*"]), (["onnx/"], None),
    (["model-0000[1-2]-of-*.safetensors"], None), (["model-0000[!1]-of-*"], None), (["?????.json"], None),
    (["[[]weird].json"], None), (["a?b.txt"], None), (["*"], ["*.bin", "*.h5", "*.msgpack"]), (["*.JSON"], None),
    (["onnx/*.json"], None), (["[]"], None), (["*config*"], ["onnx/"]),
]


def cases():
    from huggingface_hub.file_download import _normalize_etag
    from huggingface_hub.utils import filter_repo_objects

    pattern_cases = [{"include": allow, "exclude": ignore,
                      "expected": list(filter_repo_objects(LISTING, allow_patterns=allow, ignore_patterns=ignore))}
                     for allow, ignore in PATTERNS]
    sha_cases = [{"length": n, "sha256": hashlib.sha256(bytes(i * 7 % 251 for i in range(n))).hexdigest()}
                 for n in (0, 1, 55, 56, 63, 64, 65, 119, 1000, 70000)]
    etags = ['"abc123"', 'W/"abc123"', "abc123", '"' + "f" * 64 + '"']
    return {"listing": LISTING, "patterns": pattern_cases, "sha256_of_pattern_bytes": sha_cases,
            "etags": [{"header": e, "normalized": _normalize_etag(e)} for e in etags]}


def make():
    contents, manifest = build_repo()
    server = serve(contents, manifest)
    work = tempfile.mkdtemp()
    cache_dir = os.path.join(work, "hub")
    isolate_environment(f"http://127.0.0.1:{server.server_address[1]}", cache_dir, offline=False)
    from huggingface_hub import snapshot_download

    folder = snapshot_download(REPO_ID, cache_dir=cache_dir)
    server.shutdown()
    check_snapshot(folder, manifest, expect_all=True)
    # The same call, offline, must find what it just wrote (this is what the Swift side must also satisfy).
    assert snapshot_download(REPO_ID, cache_dir=cache_dir, local_files_only=True) == folder

    target = os.path.join(FIXTURES, "python-cache")
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(cache_dir, target, symlinks=True, ignore=shutil.ignore_patterns(".locks", "home"))
    with open(MANIFEST, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    with open(os.path.join(FIXTURES, "cases.json"), "w") as f:
        json.dump(cases(), f, indent=1)
        f.write("\n")
    shutil.rmtree(work)
    print(f"wrote {target} (commit {manifest['commit']}) and {MANIFEST}")


def check_snapshot(folder, manifest, expect_all):
    """Every file in the snapshot is a relative symlink into blobs/ named by its etag, with the right bytes."""
    blobs = os.path.realpath(os.path.join(folder, "..", "..", "blobs"))
    found = 0
    for entry in manifest["files"]:
        pointer = os.path.join(folder, entry["path"])
        if not os.path.lexists(pointer):
            assert not expect_all, f"{entry['path']} missing from {folder}"
            continue
        found += 1
        assert os.path.islink(pointer), f"{pointer} is not a symlink"
        assert not os.path.isabs(os.readlink(pointer)), f"{pointer} links to an absolute path"
        etag = entry.get("sha256", entry["blob_id"])
        assert os.path.realpath(pointer) == os.path.join(blobs, etag), f"{pointer} -> {os.readlink(pointer)}"
        with open(pointer, "rb") as f:
            data = f.read()
        actual = hashlib.sha256(data).hexdigest() if "sha256" in entry else git_blob_id(data)
        assert actual == etag, f"{entry['path']}: content hash {actual}, expected {etag}"
    return found


def check_swift_cache(cache_dir):
    with open(MANIFEST) as f:
        manifest = json.load(f)
    isolate_environment("http://127.0.0.1:9", cache_dir, offline=True)  # port 9 (discard): never contacted
    from huggingface_hub import hf_hub_download, scan_cache_dir, snapshot_download, try_to_load_from_cache

    folder = snapshot_download(REPO_ID, cache_dir=cache_dir, local_files_only=True)
    assert os.path.basename(folder) == manifest["commit"], folder
    found = check_snapshot(folder, manifest, expect_all=False)
    config = hf_hub_download(REPO_ID, "config.json", cache_dir=cache_dir, local_files_only=True)
    assert config == os.path.join(folder, "config.json"), config
    assert try_to_load_from_cache(REPO_ID, "model.safetensors.index.json", cache_dir=cache_dir) is not None
    report = scan_cache_dir(cache_dir)
    assert not report.warnings, report.warnings
    (repo,) = [r for r in report.repos if r.repo_id == REPO_ID]
    assert {ref for revision in repo.revisions for ref in revision.refs} == {"main"}, repo.revisions
    print(f"huggingface_hub found {REPO_ID} in {cache_dir}: {found} files, all intact")


if __name__ == "__main__":
    if sys.argv[1:] == ["make"]:
        make()
    elif len(sys.argv) == 3 and sys.argv[1] == "check-swift-cache":
        check_swift_cache(sys.argv[2])
    else:
        sys.exit(__doc__)
