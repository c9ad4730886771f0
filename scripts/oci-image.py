#!/usr/bin/env python3
"""Packs a directory into a one-layer OCI image archive, without a registry or a daemon.

    oci-image.py ROOTFS OUT.tar NAME ENTRYPOINT_JSON [CMD_JSON]

The archive is an OCI image layout in a tar, as `ctr images import` reads it; the image is
named NAME. The layer is reproducible: entries sorted, owned by root, mtime 0.
"""
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile


def layer(rootfs: str) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for top, dirs, files in os.walk(rootfs):
            dirs.sort()
            for name in sorted(dirs) + sorted(files):
                path = os.path.join(top, name)
                info = tar.gettarinfo(path, arcname=os.path.relpath(path, rootfs))
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = 0
                if info.isfile():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    return out.getvalue()


def main() -> None:
    if len(sys.argv) not in (5, 6):
        sys.exit(__doc__)
    rootfs, out, name = sys.argv[1:4]
    entrypoint = json.loads(sys.argv[4])
    cmd = json.loads(sys.argv[5]) if len(sys.argv) == 6 else None
    blobs: dict[str, bytes] = {}

    def put(data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return digest

    raw = layer(rootfs)
    packed = gzip.compress(raw, mtime=0)
    config_body = {"Entrypoint": entrypoint, "Env": ["PATH=/usr/bin:/bin"], "WorkingDir": "/"}
    if cmd is not None:
        config_body["Cmd"] = cmd
    config = json.dumps({
        "architecture": "amd64",
        "os": "linux",
        "config": config_body,
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(raw).hexdigest()]},
    }, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": put(config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": put(packed), "size": len(packed)}],
    }, sort_keys=True).encode()
    index = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": put(manifest),
            "size": len(manifest),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": name,
                            "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1]},
        }],
    }, sort_keys=True).encode()

    def add(tar: tarfile.TarFile, path: str, data: bytes) -> None:
        info = tarfile.TarInfo(path)
        info.size, info.mtime, info.mode = len(data), 0, 0o644
        tar.addfile(info, io.BytesIO(data))

    with tarfile.open(out + ".partial", "w") as tar:
        add(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add(tar, "index.json", index)
        for digest, data in sorted(blobs.items()):
            add(tar, "blobs/sha256/" + digest.split(":", 1)[1], data)
    os.replace(out + ".partial", out)


if __name__ == "__main__":
    main()
