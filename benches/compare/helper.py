#!/usr/bin/env python3
"""Helpers for Ferry's comparison runner (run.sh): timing, data mutation, reporting.

Subcommands:
  measure   run one command under /usr/bin/time -v with a time limit; append wall time and
            peak RSS to a JSON-lines results file
  record    append one plain value (e.g. a repository size) to the results file
  record-path  append what crossed the network path during a step (netpath's counts before
            and after it: requests by method, bytes each way, connections)
  free-port  print a free TCP port on 127.0.0.1
  wait-http  wait until a URL answers 200
  stats     count the regular files and bytes of a tree
  gen-tree  write a synthetic tree of many small files (deterministic from a seed)
  mutate    change a deterministic 1 % of a tree's files, in place
  snapshot-id  pull the snapshot ID out of a tool's captured backup output
  meta      describe the machine, data and settings (from environment variables) as JSON
  report    medians over runs, as a Markdown table
"""

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import socket
import time
import urllib.error
import urllib.request

TOOLS = ("ferry", "kopia", "restic")


def cmd_measure(args):
    """Runs args.command; records wall seconds and peak RSS; exits with its status."""
    with tempfile.NamedTemporaryFile(prefix="time-", suffix=".txt", delete=False) as f:
        time_file = f.name
    stdout = open(args.stdout, "wb") if args.stdout else subprocess.DEVNULL
    stderr = open(args.stderr, "wb") if args.stderr else subprocess.DEVNULL
    command = ["/usr/bin/time", "-v", "-o", time_file] + args.command
    start = time.monotonic()
    proc = subprocess.Popen(command, stdout=stdout, stderr=stderr, start_new_session=True)
    timed_out = False

    def on_term(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    try:
        status = proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        # The command runs in its own session: end exactly that process group.
        os.killpg(proc.pid, signal.SIGKILL)
        status = proc.wait()
    except BaseException:
        # Interrupted (Ctrl-C, SIGTERM): the command's group does not see the terminal's
        # signal, so end it here before leaving.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        os.unlink(time_file)
        raise
    wall = time.monotonic() - start
    for stream in (stdout, stderr):
        if stream is not subprocess.DEVNULL:
            stream.close()
    rss_kib = None
    try:
        with open(time_file, encoding="utf-8", errors="replace") as f:
            for line in f:
                if "Maximum resident set size" in line:
                    rss_kib = int(line.rsplit(":", 1)[1].strip())
    finally:
        os.unlink(time_file)
    if timed_out:
        print(f"{args.tool} {args.metric}: timed out after {args.timeout} s", file=sys.stderr)
        sys.exit(124)
    if status != 0:
        print(f"{args.tool} {args.metric}: exit status {status}", file=sys.stderr)
        if args.stderr:
            with open(args.stderr, encoding="utf-8", errors="replace") as f:
                tail = f.read()[-4000:]
            print(tail, file=sys.stderr)
        sys.exit(status)
    row = {"tool": args.tool, "run": args.run, "metric": args.metric, "seconds": wall, "rss_kib": rss_kib}
    with open(args.results, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    rss = f"{rss_kib / 1024:.0f} MiB" if rss_kib is not None else "?"
    print(f"  {args.tool:6} {args.metric:16} {wall:8.2f} s  peak RSS {rss}", file=sys.stderr)


def cmd_record(args):
    row = {"tool": args.tool, "run": args.run, "metric": args.metric, "value": args.value}
    with open(args.results, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


PATH_COUNTS = ("requests", "PUT", "GET", "HEAD", "POST", "DELETE", "bytes_up", "bytes_down", "connections", "unparsed_streams")


def cmd_record_path(args):
    """Appends what crossed the path between two of netpath's counts, one row per count."""
    with open(args.before, encoding="utf-8") as f:
        before = json.load(f)
    with open(args.after, encoding="utf-8") as f:
        after = json.load(f)

    def get(doc, key):
        return doc.get("by_method", {}).get(key, 0) if key.isupper() else doc.get(key, 0)

    with open(args.results, "a", encoding="utf-8") as f:
        for key in PATH_COUNTS:
            row = {"tool": args.tool, "run": args.run, "metric": f"{args.metric}:{key}",
                   "count": get(after, key) - get(before, key)}
            f.write(json.dumps(row) + "\n")
    if after.get("unparsed_streams", 0) > before.get("unparsed_streams", 0):
        print(f"{args.tool} {args.metric}: some requests could not be counted (a stream netpath could not parse)",
              file=sys.stderr)


def cmd_free_port(_args):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        print(s.getsockname()[1])


def cmd_wait_http(args):
    deadline = time.monotonic() + args.timeout
    last = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(args.url, timeout=2) as r:
                if r.status == 200:
                    return
                last = f"status {r.status}"
        except (urllib.error.URLError, OSError) as e:
            last = str(e)
        time.sleep(0.2)
    sys.exit(f"wait-http: {args.url} did not answer 200 within {args.timeout} s ({last})")


def cmd_make_bucket(args):
    """Creates a bucket over the S3 API (MinIO keeps more than a folder for a bucket)."""
    try:
        import boto3
    except ImportError:
        sys.exit("make-bucket: Python's boto3 is needed to create the benchmark's buckets "
                 "(pip install boto3)")
    s3 = boto3.client("s3", endpoint_url=args.endpoint, region_name="us-east-1",
                      aws_access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"])
    s3.create_bucket(Bucket=args.bucket)


def regular_files(root):
    """Sorted (relative path, size) of every regular file under root (symlinks not followed)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if os.path.isfile(path) and not os.path.islink(path):
                out.append((os.path.relpath(path, root), st.st_size))
    out.sort()
    return out


def cmd_stats(args):
    files = regular_files(args.dir)
    print(json.dumps({"files": len(files), "bytes": sum(s for _, s in files)}))


# Sizes of the synthetic tree's files: (share, smallest, largest) bands; about 2.9 KB a file on
# average, most of them under 2 KiB (many-small-files trees: mail stores, package caches,
# source checkouts, object-per-file databases).
GEN_BANDS = ((0.70, 0, 2048), (0.28, 2048, 8192), (0.02, 8192, 65536))
GEN_WORDS = ("data", "volume", "snapshot", "backup", "restore", "chunk", "index", "pack", "node",
             "agent", "upload", "download", "cluster", "storage", "object", "bucket", "tree",
             "file", "block", "key", "value", "state", "phase", "error", "retry", "limit")


def cmd_first_files(args):
    """Hard-links (copies across file systems) the tree's first files in path order whose
    sizes add up to at most --bytes into a new folder, symbolic links as they are."""
    total = files = 0
    full = False
    for root, dirs, names in os.walk(args.src):
        if full:
            break
        dirs.sort()
        rel = os.path.relpath(root, args.src)
        os.makedirs(os.path.join(args.dst, rel), exist_ok=True)
        for name in sorted(names):
            if name == ".complete":
                continue
            a, b = os.path.join(root, name), os.path.join(args.dst, rel, name)
            if os.path.islink(a):
                os.symlink(os.readlink(a), b)
                continue
            size = os.path.getsize(a)
            if total + size > args.bytes:
                full = True
                break
            try:
                os.link(a, b)
            except OSError:
                shutil.copy2(a, b)
            total += size
            files += 1
    print(f"{files} files, {total / 1e9:.2f} GB of file data")


def cmd_gen_tree(args):
    """A tree of N regular files, 1,000 per directory, 10 directories per parent.

    Each file is a unique header line followed by a slice of a 32 MiB pool of word text taken
    at a seeded offset: files compress like text and do not deduplicate against each other.
    With --dirs K: N empty files in K directories side by side (entries, not bytes).
    """
    if args.dirs:
        return gen_flat(args.dir, args.files, args.dirs)
    rng = random.Random(args.seed)
    pool_words = rng.choices(GEN_WORDS, k=6 * 1024 * 1024)
    pool = " ".join(pool_words).encode()[: 32 << 20]
    os.makedirs(args.dir, exist_ok=True)
    total = 0
    made = set()
    for i in range(args.files):
        d = os.path.join(args.dir, f"d{i // 10000:04}", f"s{(i // 1000) % 10}")
        if d not in made:
            os.makedirs(d, exist_ok=True)
            made.add(d)
        r = rng.random()
        for share, lo, hi in GEN_BANDS:
            if r < share:
                break
            r -= share
        size = rng.randrange(lo, hi)
        head = f"// synthetic file {i} of seed {args.seed}\n".encode()
        off = rng.randrange(len(pool) - hi)
        body = (head + pool[off:off + size])[:max(size, len(head))]
        fd = os.open(os.path.join(d, f"f{i % 1000:03}.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, body)
        finally:
            os.close(fd)
        total += len(body)
    print(json.dumps({"files": args.files, "bytes": total}))


def gen_flat(root, files, dirs):
    """N empty files in K directories, f0000000 upwards in each."""
    per = -(-files // dirs)
    for d in range(dirs):
        path = os.path.join(root, f"d{d}")
        os.makedirs(path, exist_ok=True)
        for i in range(d * per, min(files, (d + 1) * per)):
            os.close(os.open(os.path.join(path, f"f{i:08}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
    print(json.dumps({"files": files, "bytes": 0}))


def cmd_mutate(args):
    """Changes a deterministic share of the files: by count exactly, by bytes approximately.

    Files are sorted by size and cut into k strata of equal count (k = the share of the file
    count); one seeded-random file is drawn from each stratum, so the changed files follow the
    tree's size distribution and their bytes come close to the same share of the bytes. Each
    chosen file gets one short line inserted at a seeded offset: content after it shifts, as
    with a real edit, and its size and mtime change.
    """
    files = regular_files(args.dir)
    if not files:
        sys.exit(f"mutate: no regular files under {args.dir}")
    rng = random.Random(args.seed)
    k = max(1, round(len(files) * args.percent / 100))
    by_size = sorted(files, key=lambda f: (f[1], f[0]))
    chosen = []
    for i in range(k):
        lo = i * len(by_size) // k
        hi = max(lo + 1, (i + 1) * len(by_size) // k)
        chosen.append(by_size[rng.randrange(lo, hi)])
    changed_bytes = 0
    for n, (rel, size) in enumerate(chosen):
        path = os.path.join(args.dir, rel)
        with open(path, "rb") as f:
            data = f.read()
        at = rng.randrange(len(data) + 1)
        line = f"/* ferry benchmark change {args.seed}:{n} */\n".encode()
        with open(path, "wb") as f:
            f.write(data[:at] + line + data[at:])
        changed_bytes += size
    total = sum(s for _, s in files)
    print(json.dumps({
        "files_changed": k,
        "files_total": len(files),
        "bytes_of_changed_files": changed_bytes,
        "bytes_total": total,
        "percent_files": 100 * k / len(files),
        "percent_bytes": 100 * changed_bytes / total if total else 0,
    }))


def cmd_snapshot_id(args):
    """Prints the snapshot ID from a tool's backup output (stdout captured to a file)."""
    if args.root_object and args.tool != "kopia":
        sys.exit("snapshot-id: --root-object is for kopia")
    with open(args.file, encoding="utf-8", errors="replace") as f:
        text = f.read()
    if args.tool == "ferry":
        # `ferry backup --json`: one JSON object.
        for line in reversed(text.strip().splitlines()):
            line = line.strip()
            if line.startswith("{"):
                print(json.loads(line)["snapshot_id"])
                return
    elif args.tool == "restic":
        # `restic backup --json`: JSON lines; the summary carries the ID.
        for line in reversed(text.strip().splitlines()):
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("message_type") == "summary":
                print(msg["snapshot_id"])
                return
    elif args.tool == "kopia":
        # `kopia snapshot create --json`: the new manifest(s) as JSON.
        try:
            doc = json.loads(text)
        except ValueError:
            start = text.find("{")
            doc = json.loads(text[start:]) if start >= 0 else None
        if isinstance(doc, list):
            doc = doc[-1] if doc else None
        if isinstance(doc, dict) and "id" in doc:
            # --root-object: the root directory's object ID, for `kopia show OBJ/PATH`.
            if not args.root_object:
                print(doc["id"])
                return
            root = (doc.get("rootEntry") or {}).get("obj")
            if root:
                print(root)
                return
            sys.exit(f"snapshot-id: no root object in kopia's snapshot in {args.file}")
    sys.exit(f"snapshot-id: no {args.tool} snapshot ID in {args.file}")


METRICS = [
    # (metric key in results, column title, kind)
    ("backup_first", "first backup (s)", "seconds"),
    ("backup_unchanged", "no-change backup (s)", "seconds"),
    ("backup_changed", "1%-changed backup (s)", "seconds"),
    ("restore", "restore (s)", "seconds"),
    ("restore_durable", "restore, then on disk (s)", "seconds"),
]


def with_durable(rows):
    """rows, plus per tool and run the restore's seconds with the sync after it (restore_sync)
    added: the time until the restored data is on disk."""
    syncs = {(r["tool"], r["run"]): r["seconds"] for r in rows
             if r["metric"] == "restore_sync" and "seconds" in r}
    extra = [{"tool": r["tool"], "run": r["run"], "metric": "restore_durable",
              "seconds": r["seconds"] + syncs[(r["tool"], r["run"])]}
             for r in rows if r["metric"] == "restore" and "seconds" in r
             and (r["tool"], r["run"]) in syncs]
    return rows + extra


def medians(rows):
    """{tool: {metric: median}} for seconds, rss and recorded values."""
    acc = {}
    for r in rows:
        t = acc.setdefault(r["tool"], {})
        if "seconds" in r:
            t.setdefault(r["metric"], []).append(r["seconds"])
            if r.get("rss_kib") is not None:
                t.setdefault(r["metric"] + ":rss", []).append(r["rss_kib"])
        elif "count" in r:
            t.setdefault(r["metric"], []).append(r["count"])
        else:
            t.setdefault(r["metric"], []).append(r["value"])
    return {tool: {m: statistics.median(v) for m, v in ms.items()} for tool, ms in acc.items()}


def peak_backup_rss(rows, tool):
    """Median over runs of the highest peak RSS among a run's three backups, in KiB."""
    per_run = {}
    for r in rows:
        if r["tool"] == tool and r["metric"].startswith("backup_") and r.get("rss_kib") is not None:
            per_run[r["run"]] = max(per_run.get(r["run"], 0), r["rss_kib"])
    return statistics.median(per_run.values()) if per_run else None


def fmt(v, digits=2):
    return "–" if v is None else f"{v:.{digits}f}"


def describe_mutation(text):
    try:
        m = json.loads(text)
    except ValueError:
        return "not run"
    return (
        f"{m['files_changed']:,} of {m['files_total']:,} files ({m['percent_files']:.2f} %), holding "
        f"{m['bytes_of_changed_files'] / 1e6:,.2f} of {m['bytes_total'] / 1e6:,.1f} MB "
        f"({m['percent_bytes']:.2f} %), each given one inserted line (seeded; figures of the last run)"
    )


def describe_restore(e, verify):
    """The report's sentence on the restore target, from run.sh's settings."""
    dio = e.get("RESTORE_DIO") == "1"
    volume = e.get("VOLUME") == "1"
    if e.get("RESTORE_FS") != "1":
        where = "into an empty directory on the same disk"
    elif volume:
        where = (
            "onto a fresh block device of the volume's size (a loop device over a sparse file on the same "
            "disk, " + ("reading and writing it with direct I/O, as a disk would" if dio
                        else "through the page cache (--buffered-loop)")
            + "), made before each restore. Ferry writes the device (`ferry restore SNAP DEV`, as its agent "
            "restores a block PVC); kopia copies the image file's content onto it in one stream "
            "(`kopia show OBJ/volume.img >DEV`), as Velero's kopia block restore does (kopia's own restore "
            "refuses a device); restic, which writes a device only in one stream too (`restic dump --target "
            "DEV`), restores its image file into a new ext4 file system instead (its fastest way; made as "
            "for a tree, on a loop device of the same kind, three times the volume's size plus 1 GiB)"
        )
    else:
        where = (
            "into a new ext4 file system (mkfs.ext4 with inodes for twice the data's entries, at least its "
            "default, and the inode tables and journal written at once: -E lazy_itable_init=0,lazy_journal_init=0; "
            "on a loop device over a sparse file on the same disk, "
            + ("which reads and writes that file with direct I/O, as a disk would" if dio
               else "through the page cache (--buffered-loop): every restored byte is copied and "
               "written back a second time, for the image file")
            + "), made before each restore as a newly provisioned volume would be"
        )
    check = ""
    if verify:
        check = ", then compared with the source by " + ("cmp" if volume else "diff -r") + " (not timed)"
        if volume and e.get("RESTORE_FS") == "1":
            check = ". Each restored image is then compared with the source by cmp (not timed)"
    return f"Restore is of the last (1%-changed) snapshot {where}{check}."


def cmd_meta(_args):
    e = os.environ
    verify = e.get("VERIFY") == "1"
    meta = {
        "date": e["DATE"],
        "host": e["HOST"],
        "runs": int(e["RUNS"]),
        "note": e.get("NOTE", ""),
        "command": e["COMMAND_LINE"],
        "data": dict(json.loads(e["DATA_STATS"]), label=e["DATA_LABEL"]),
        "mutation": describe_mutation(e.get("MUTATION", "")),
        "versions": {k: e[v] for k, v in (("ferry", "V_FERRY"), ("kopia", "V_KOPIA"), ("restic", "V_RESTIC")) if e.get(v)},
        "load_before": e["LOAD_BEFORE"],
        "load_after": e["LOAD_AFTER"],
        "machine": {"nproc": e["NPROC"], "cpu": e["CPU"], "memory": e["MEMORY"], "kernel": e["KERNEL"], "disk": e["DISK"]},
        "remote": e.get("REMOTE", ""),
        "settings": [
            (
                "Every repository is in one MinIO server (objects on tmpfs), each tool's in a bucket of its own made "
                "afresh for each run, reached over netpath: a relay on loopback that delays and rate-limits each "
                f"direction ({e['REMOTE'].split('/')[0]} ms round trip, {e['REMOTE'].split('/')[1]} Mbit/s each way, "
                "one link shared by all of a tool's connections, a new connection's first request one round trip "
                "later for the handshake; no loss, no slow start) and counts the HTTP requests sent. This kernel has "
                "no netem qdisc, so the path is in user space (benches/src/netpath.rs). Repository sizes are the bytes "
                "MinIO keeps in the bucket's folder (objects and MinIO's metadata). Each tool keeps its local cache "
                "between the steps of a run (as a node agent would) and starts each run without one."
                if e.get("REMOTE")
                else "All repositories are local directories on the same file system as the data copy."
            ),
            "Before each tool's sequence the data is copied afresh (cp -a), synced, and read once in full "
            "(warm-up), so every tool starts with the data in the page cache; nothing is dropped from the cache.",
            "The unchanged and 1%-changed backups are of that same working copy, so each tool finds its parent "
            "snapshot by path; Ferry is given --parent explicitly.",
            describe_restore(e, verify),
            "Right after each restore, `sync -f` of the restore's file system (of a device: `sync DEV`, "
            "its fsync, which also flushes the device's write cache) is timed on its own: \"restore, then "
            "on disk\" is the restore plus that sync. Ferry's restore ends with syncfs (fsync for a "
            "volume), so its data is on disk when it reports success; kopia and restic return with "
            "their writes still in the page cache, so their \"restore\" column leaves the disk writes out "
            "(except onto a device: the kernel writes a device's cached data back when its last user "
            "closes it, inside the restore's time).",
            "Ferry: defaults (zstd level 3 with a bypass for incompressible chunks, XChaCha20-Poly1305, "
            "argon2id key file).",
            "kopia: defaults as Velero uses them: compression off, default splitter, hash and encryption; periodic "
            "maintenance disabled after repository create (Velero runs maintenance as separate jobs); file "
            "logging disabled for snapshot and restore (Velero uses kopia as a library, without CLI log files); "
            "update check off.",
            "restic: defaults (repository format 2, compression auto, read concurrency 2).",
            "Wall time and peak RSS come from /usr/bin/time -v per command (so they include each tool's start-up "
            "and key derivation); the backup peak RSS is the highest of the three backups; time limit "
            f"{e['TIMEOUT']} s per command.",
        ],
    }
    json.dump(meta, sys.stdout, indent=1)


STEPS = ("backup_first", "backup_unchanged", "backup_changed", "restore")


def path_tables(med, tools, data_bytes):
    """The network path's tables (--remote runs): requests and bytes per step, per GB of data."""
    if not any(f"{s}:requests" in med[t] for t in tools for s in STEPS):
        return []
    gb = data_bytes / 1e9
    out = ["", "Requests and bytes over the path, per step (medians over runs):", ""]
    head = ["tool", "step", "requests", "PUT", "GET", "HEAD", "POST", "DELETE", "MB up", "MB down",
            "connections", "requests per GB of data"]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "|".join(["---", "---"] + ["---:"] * (len(head) - 2)) + "|")
    for tool in tools:
        m = med[tool]
        for step in STEPS:
            if f"{step}:requests" not in m:
                continue
            c = {k: m.get(f"{step}:{k}", 0) for k in PATH_COUNTS}
            out.append("| " + " | ".join([
                tool, step, f"{c['requests']:,.0f}", f"{c['PUT']:,.0f}", f"{c['GET']:,.0f}", f"{c['HEAD']:,.0f}",
                f"{c['POST']:,.0f}", f"{c['DELETE']:,.0f}", f"{c['bytes_up'] / 1e6:,.1f}",
                f"{c['bytes_down'] / 1e6:,.1f}", f"{c['connections']:,.0f}", f"{c['requests'] / gb:,.0f}",
            ]) + " |")
    if any(med[t].get(f"{s}:unparsed_streams", 0) for t in tools for s in STEPS):
        out += ["", "**Some streams could not be parsed: their later requests are not counted.**"]
    if "ferry" in med and len(tools) > 1:
        out += ["", "Requests, other tool ÷ Ferry (above 1 means Ferry sends fewer):", ""]
        out.append("| vs | " + " | ".join(STEPS) + " |")
        out.append("|---|" + "|".join(["---:"] * len(STEPS)) + "|")
        f = med["ferry"]
        for tool in tools:
            if tool == "ferry":
                continue
            cells = [tool]
            for step in STEPS:
                a, b = med[tool].get(f"{step}:requests"), f.get(f"{step}:requests")
                cells.append(fmt(a / b if a and b else None) + "×")
            out.append("| " + " | ".join(cells) + " |")
    return out


def cmd_report(args):
    with open(args.results, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    with open(args.meta, encoding="utf-8") as f:
        meta = json.load(f)
    med = medians(with_durable(rows))
    tools = [t for t in TOOLS if t in med]
    data_bytes = meta["data"]["bytes"]
    mb = 1e6
    out = []
    head = ["tool"] + [title for _, title, _ in METRICS] + [
        "first backup (MB/s)", "restore (MB/s)", "repo after 1st (MB)", "repo after 3 (MB)",
        "peak RSS backup (MiB)", "peak RSS restore (MiB)",
    ]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|")
    for tool in tools:
        m = med[tool]
        cells = [f"{tool} {meta['versions'].get(tool, '')}".strip()]
        cells += [fmt(m.get(key)) for key, _, _ in METRICS]
        first, rest = m.get("backup_first"), m.get("restore")
        cells.append(fmt(data_bytes / mb / first if first else None, 0))
        cells.append(fmt(data_bytes / mb / rest if rest else None, 0))
        cells.append(fmt(m["repo_bytes_first"] / mb if "repo_bytes_first" in m else None, 1))
        cells.append(fmt(m["repo_bytes_all"] / mb if "repo_bytes_all" in m else None, 1))
        rss_b = peak_backup_rss(rows, tool)
        cells.append(fmt(rss_b / 1024 if rss_b else None, 0))
        rss_r = m.get("restore:rss")
        cells.append(fmt(rss_r / 1024 if rss_r else None, 0))
        out.append("| " + " | ".join(cells) + " |")
    if "ferry" in med and len(tools) > 1:
        out.append("")
        out.append("Ratios within this run (other tool ÷ Ferry; above 1 means Ferry is faster or smaller):")
        out.append("")
        rhead = ["vs"] + [title.replace(" (s)", "") for _, title, _ in METRICS] + ["repo after 3", "peak RSS backup", "peak RSS restore"]
        out.append("| " + " | ".join(rhead) + " |")
        out.append("|" + "|".join(["---"] + ["---:"] * (len(rhead) - 1)) + "|")
        f = med["ferry"]
        for tool in tools:
            if tool == "ferry":
                continue
            m = med[tool]
            cells = [tool]
            for key, _, _ in METRICS:
                cells.append(fmt(m[key] / f[key] if m.get(key) and f.get(key) else None) + "×")
            cells.append(fmt(m["repo_bytes_all"] / f["repo_bytes_all"] if f.get("repo_bytes_all") and "repo_bytes_all" in m else None) + "×")
            fb, ob = peak_backup_rss(rows, "ferry"), peak_backup_rss(rows, tool)
            cells.append(fmt(ob / fb if fb and ob else None) + "×")
            fr, orr = f.get("restore:rss"), m.get("restore:rss")
            cells.append(fmt(orr / fr if fr and orr else None) + "×")
            out.append("| " + " | ".join(cells) + " |")
    out += path_tables(med, tools, data_bytes)
    files = meta["data"]["files"]
    if files >= 100_000:
        out += ["", f"Time per file (µs; the medians above over {files:,} files):", ""]
        out.append("| tool | " + " | ".join(title.replace(" (s)", "") for _, title, _ in METRICS) + " |")
        out.append("|" + "|".join(["---"] + ["---:"] * len(METRICS)) + "|")
        for tool in tools:
            m = med[tool]
            cells = [tool] + [fmt(m[key] * 1e6 / files if m.get(key) else None, 1) for key, _, _ in METRICS]
            out.append("| " + " | ".join(cells) + " |")
    table = "\n".join(out)
    if args.table_only:
        print(table)
        return
    title = f"# Ferry vs kopia vs restic — {meta['date']} on {meta['host']}"
    if meta.get("remote"):
        rtt, rate = meta["remote"].split("/")
        title += f", over a {rtt} ms / {rate} Mbit/s path to MinIO"
    doc = [title, ""]
    if meta.get("note"):
        doc += [f"**Note:** {meta['note']}", ""]
    d = meta["data"]
    doc += [
        f"Data: {d['label']}: {d['files']:,} files, {d['bytes'] / mb:,.1f} MB. "
        f"Runs: {meta['runs']} (medians shown; tool order rotated each run). "
        f"1%-changed: {meta.get('mutation', '')}.",
        "",
        table,
        "",
        "## Machine",
        "",
        f"- CPU: {meta['machine']['cpu']} ({meta['machine']['nproc']} cores visible)",
        f"- Memory: {meta['machine']['memory']}",
        f"- Kernel: {meta['machine']['kernel']}",
        f"- Disk holding data, repositories and restores (or the restores' image files): "
        f"{meta['machine']['disk']}",
        f"- Load average before: {meta['load_before']}; after: {meta['load_after']}",
        "",
        "## Settings",
        "",
    ]
    doc += [f"- {s}" for s in meta["settings"]]
    doc += ["", "## Command", "", "```", meta["command"], "```", "", "## Every measurement", ""]
    doc += ["| run | tool | metric | seconds | peak RSS (MiB) | size |", "|---:|---|---|---:|---:|---:|"]
    for r in rows:
        rss = fmt(r["rss_kib"] / 1024, 0) if r.get("rss_kib") else ""
        value = f"{r['value'] / 1e6:,.1f} MB" if "value" in r else (f"{r['count']:,}" if "count" in r else "")
        secs = fmt(r["seconds"]) if "seconds" in r else ""
        doc.append(f"| {r['run']} | {r['tool']} | {r['metric']} | {secs} | {rss} | {value} |")
    text = "\n".join(doc) + "\n"
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(table)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    m = sub.add_parser("measure")
    m.add_argument("--results", required=True)
    m.add_argument("--tool", required=True)
    m.add_argument("--run", type=int, required=True)
    m.add_argument("--metric", required=True)
    m.add_argument("--timeout", type=float, default=3600)
    m.add_argument("--stdout")
    m.add_argument("--stderr")
    m.add_argument("command", nargs=argparse.REMAINDER)
    m.set_defaults(func=cmd_measure)

    r = sub.add_parser("record")
    r.add_argument("--results", required=True)
    r.add_argument("--tool", required=True)
    r.add_argument("--run", type=int, required=True)
    r.add_argument("--metric", required=True)
    r.add_argument("--value", type=float, required=True)
    r.set_defaults(func=cmd_record)

    rpth = sub.add_parser("record-path")
    rpth.add_argument("--results", required=True)
    rpth.add_argument("--tool", required=True)
    rpth.add_argument("--run", type=int, required=True)
    rpth.add_argument("--metric", required=True)
    rpth.add_argument("--before", required=True)
    rpth.add_argument("--after", required=True)
    rpth.set_defaults(func=cmd_record_path)

    fp = sub.add_parser("free-port")
    fp.set_defaults(func=cmd_free_port)

    wh = sub.add_parser("wait-http")
    wh.add_argument("url")
    wh.add_argument("--timeout", type=float, default=60)
    wh.set_defaults(func=cmd_wait_http)

    mb = sub.add_parser("make-bucket")
    mb.add_argument("--endpoint", required=True)
    mb.add_argument("bucket")
    mb.set_defaults(func=cmd_make_bucket)

    s = sub.add_parser("stats")
    s.add_argument("dir")
    s.set_defaults(func=cmd_stats)

    ff = sub.add_parser("first-files")
    ff.add_argument("src")
    ff.add_argument("dst")
    ff.add_argument("--bytes", type=int, required=True)
    ff.set_defaults(func=cmd_first_files)

    g = sub.add_parser("gen-tree")
    g.add_argument("dir")
    g.add_argument("--files", type=int, required=True)
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--dirs", type=int, default=0)
    g.set_defaults(func=cmd_gen_tree)

    mu = sub.add_parser("mutate")
    mu.add_argument("dir")
    mu.add_argument("--seed", type=int, required=True)
    mu.add_argument("--percent", type=float, default=1.0)
    mu.set_defaults(func=cmd_mutate)

    si = sub.add_parser("snapshot-id")
    si.add_argument("--tool", required=True, choices=TOOLS)
    si.add_argument("--root-object", action="store_true",
                    help="kopia: the snapshot's root object ID instead of its manifest ID")
    si.add_argument("file")
    si.set_defaults(func=cmd_snapshot_id)

    me = sub.add_parser("meta")
    me.set_defaults(func=cmd_meta)

    rp = sub.add_parser("report")
    rp.add_argument("--results", required=True)
    rp.add_argument("--meta", required=True)
    rp.add_argument("--out")
    rp.add_argument("--table-only", action="store_true")
    rp.set_defaults(func=cmd_report)

    args = p.parse_args()
    if getattr(args, "command", None) and args.command[:1] == ["--"]:
        args.command = args.command[1:]
    args.func(args)


if __name__ == "__main__":
    main()
