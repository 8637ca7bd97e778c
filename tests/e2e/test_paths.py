"""End-to-end tests of files and paths: nothing a client sends reads or writes outside a workload's
root or the image store.

Real processes only: redis-server, a pivirt-gateway, a pivirt-scheduler, an ops worker and one
node agent (pod "pp", process engine) driven by Debian's python3-grpcio. Each test keeps a
directory "outside" (in the stack's temporary directory) with a sentinel file, points symbolic
links in a workload's root at it, and checks afterwards that the sentinel kept its content and
that nothing new appeared there (nor in /tmp under the test's names).

Classes:
  Copy      paths with ".." are refused naming the path; a path through a symbolic link of the
            root is refused, and the link itself is archived as a link (never followed), as is a
            link inside a copied directory; a fifo or a device node named directly is refused
            (not an empty archive); Send to a fifo or a device node in the root is refused
            instead of blocking on it or writing the device.
  LargeFile SendLargeFile's dst with "..", or through a symbolic link of the root, is refused;
            an absolute dst is a path inside the root and lands there.
  Raw       BuildImage RAW refuses archives with a "../x" member, an absolute member, a symbolic
            link followed by a member written through it, a character device or a fifo, plain
            or gzip-compressed, with 1071 naming the member; nothing is stored in the node's
            store or the registry and the build's scratch directory is gone. A symbolic link
            pointing outside on its own is an image's business: accepted.
  Scm       an SCM stage's dir with ".." is refused by the gateway; a stage whose base image is a
            gzip archive with a device member is refused naming the member (the agent, as root,
            would otherwise make the device node).
"""
import gzip
import io
import json
import os
import stat
import subprocess
import tarfile
import tempfile
import time
import unittest
import uuid

import pvtest
from pb import core_pb2, core_pb2_grpc

_stack = None
NODE, POD = "pa", "pp"


def setUpModule():
    global _stack
    _stack = pvtest.Stack(gateways=1, workers=1, schedulers=1, agents=[(NODE, POD)],
                          config={"worker": {"build_pod": POD, "status_interval_seconds": 1},
                                  "git": {"scm_type": "git"}})
    _stack.start()
    path = os.path.join(_stack.data_dir, "images", "demo", "1.tar")
    os.makedirs(os.path.dirname(path))
    with tarfile.open(path, "w") as t:
        add_file(t, "run.sh", b"sleep 60\n")


def tearDownModule():
    _stack.stop()


def add_file(t, name, data, mode=0o644):
    i = tarfile.TarInfo(name)
    i.size = len(data)
    i.mode = mode
    t.addfile(i, io.BytesIO(data))


def add_special(t, name, kind, linkname=""):
    i = tarfile.TarInfo(name)
    i.type = kind
    i.linkname = linkname
    if kind == tarfile.CHRTYPE:
        i.devmajor, i.devminor = 1, 3
    t.addfile(i)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def archive(build, compress=False):
    """A tar archive (bytes) made by build(tarfile), gzip-compressed when compress."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        build(t)
    data = buf.getvalue()
    return gzip.compress(data) if compress else data


class Base(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stack = _stack
        cls.core = core_pb2_grpc.CoreRPCStub(cls.stack.channel(0))
        cls.addr = cls.stack.gateways[0].addrs[0]

    def setUp(self):
        # what an escape would reach: a directory with a sentinel, and a /tmp name of our own
        self.outside = tempfile.mkdtemp(prefix="outside-", dir=self.stack.tmpdir)
        self.sentinel = os.path.join(self.outside, "secret")
        with open(self.sentinel, "wb") as f:
            f.write(b"SENTINEL-" + uuid.uuid4().hex.encode())
        self.secret = read(self.sentinel)
        self.tmpname = "pvpaths-" + uuid.uuid4().hex[:12]

    def tearDown(self):
        self.assertEqual(os.listdir(self.outside), ["secret"], "a file appeared outside")
        self.assertEqual(read(self.sentinel), self.secret)
        self.assertFalse([n for n in os.listdir("/tmp") if n.startswith(self.tmpname)])
        self.assertFalse(os.path.lexists(os.path.join("/", self.tmpname)))

    def workload(self):
        msgs = list(self.core.CreateWorkload(core_pb2.DeployOptions(
            name="paths", entrypoint=core_pb2.EntrypointOptions(
                name="web", commands=["/bin/sh", "-c", "sleep 120"]),
            podname=POD, image="demo:1", count=1,
            resources={"cpumem": json.dumps({"memory-request": "32M"}).encode()}), timeout=60))
        self.assertTrue(msgs[0].success, msgs[0].error)
        wid = msgs[0].id
        self.addCleanup(lambda: list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(
            IDs=[wid], force=True), timeout=60)))
        return wid, os.path.join(self.stack.data_dir, "engine", msgs[0].nodename, wid, "root")

    def copy(self, wid, paths):
        """{path: (error, archive bytes)} of one Copy call."""
        got = {}
        for c in self.core.Copy(core_pb2.CopyOptions(
                targets={wid: core_pb2.CopyPaths(paths=paths)}), timeout=60):
            err, data = got.get(c.path, ("", b""))
            got[c.path] = (err + c.error, data + c.data)
        self.assertEqual(sorted(got), sorted(set(paths)))
        return got

    def send(self, wid, data):
        got = list(self.core.Send(core_pb2.SendOptions(IDs=[wid], data=data), timeout=60))
        self.assertEqual(sorted(g.path for g in got), sorted(data))
        return {g.path: g.error for g in got}

    def build_raw(self, name, tar):
        t = pvtest.grpc_trailers(self.addr, "/pb.CoreRPC/BuildImage", core_pb2.BuildImageOptions(
            name=name, tags=["v1"], build_method=core_pb2.BuildImageOptions.RAW,
            tar=tar).SerializeToString(), timeout=60)
        return t.get("grpc-status"), t.get("grpc-message", "")

    def assert_not_stored(self, name):
        for where in ("images", "registry"):
            self.assertFalse(os.path.exists(os.path.join(self.stack.data_dir, where, name)),
                             (where, name))


class Copy(Base):
    def test_dotdot_and_links_are_not_followed(self):
        wid, root = self.workload()
        os.symlink(self.outside, os.path.join(root, "out"))
        os.makedirs(os.path.join(root, "d"))
        with open(os.path.join(root, "d", "own"), "wb") as f:
            f.write(b"own")
        os.symlink(self.sentinel, os.path.join(root, "d", "l"))
        got = self.copy(wid, ["/../../etc/passwd", "/a/../../x", "../" + self.tmpname,
                              "/out/secret", "/out", "/d"])
        for p in ("/../../etc/passwd", "/a/../../x", "../" + self.tmpname):
            err, data = got[p]
            self.assertEqual(data, b"", p)
            self.assertIn('path "%s": "." and ".." are not allowed' % p, err)
        err, data = got["/out/secret"]
        self.assertEqual(data, b"")
        self.assertIn("/out/secret", err)
        self.assertRegex(err, "symbolic link is in the way|Not a directory")
        # the link itself is archived as a link: nothing of what it points to
        err, data = got["/out"]
        self.assertEqual(err, "")
        self.assertNotIn(self.secret, data)
        with tarfile.open(fileobj=io.BytesIO(data)) as t:
            members = t.getmembers()
        self.assertEqual([(m.name, m.issym(), m.linkname) for m in members],
                         [("out", True, self.outside)])
        err, data = got["/d"]
        self.assertEqual(err, "")
        self.assertNotIn(self.secret, data)
        with tarfile.open(fileobj=io.BytesIO(data)) as t:
            kinds = {m.name: (m.type, m.linkname) for m in t.getmembers()}
            self.assertEqual(t.extractfile("d/own").read(), b"own")
        self.assertEqual(kinds["d/l"], (tarfile.SYMTYPE, self.sentinel))
        self.assertEqual(sorted(kinds), ["d", "d/l", "d/own"])

    def test_fifos_and_devices_are_refused(self):
        wid, root = self.workload()
        os.mkfifo(os.path.join(root, "p"))
        os.mknod(os.path.join(root, "null"), 0o666 | 0o020000, os.makedev(1, 3))
        got = self.copy(wid, ["/p", "/null"])
        self.assertEqual(got["/p"], ("copy /p: a fifo is not copied", b""))
        self.assertEqual(got["/null"], ("copy /null: a character device is not copied", b""))
        # Send would have blocked on the fifo (no reader) or written the device
        errs = self.send(wid, {"/p": b"x", "/null": b"x"})
        self.assertEqual(errs["/p"], "write /p: a fifo is there, not a regular file")
        self.assertEqual(errs["/null"], "write /null: a character device is there, not a regular "
                                        "file")
        # a link in the root to outside, then Send through it and onto it
        os.symlink(self.outside, os.path.join(root, "out2"))
        os.symlink(self.sentinel, os.path.join(root, "s"))
        errs = self.send(wid, {"/out2/" + self.tmpname: b"x", "/s": b"overwritten",
                               "../" + self.tmpname: b"x", "/" + self.tmpname: b"in"})
        self.assertIn("/out2/%s: " % self.tmpname, errs["/out2/" + self.tmpname])
        self.assertEqual(errs["/s"], "write /s: a symbolic link is in the way")
        self.assertIn('".." are not allowed', errs["../" + self.tmpname])
        self.assertEqual(errs["/" + self.tmpname], "")
        self.assertEqual(read(os.path.join(root, self.tmpname)), b"in")
        self.assertTrue(stat.S_ISFIFO(os.lstat(os.path.join(root, "p")).st_mode))
        self.assertEqual(read(self.sentinel), self.secret)


class LargeFile(Base):
    def send_large(self, wid, dst, blob):
        reqs = [core_pb2.FileOptions(ids=[wid], dst=dst, size=len(blob),
                                     chunk=blob[i:i + 65536])
                for i in range(0, len(blob), 65536)]
        got = list(self.core.SendLargeFile(iter(reqs), timeout=60))
        self.assertEqual([(g.id, g.path) for g in got], [(wid, dst)])
        return got[0].error

    def test_escapes_refused_absolute_lands_inside(self):
        wid, root = self.workload()
        os.symlink(self.outside, os.path.join(root, "out"))
        blob = os.urandom(150 * 1024)
        err = self.send_large(wid, "../" + self.tmpname, blob)
        self.assertEqual(err, 'path "../%s": "." and ".." are not allowed' % self.tmpname)
        err = self.send_large(wid, "/x/../../../" + self.tmpname, blob)
        self.assertIn('".." are not allowed', err)
        err = self.send_large(wid, "/out/" + self.tmpname, blob)
        self.assertIn("/out/%s: " % self.tmpname, err)
        self.assertRegex(err, "symbolic link is in the way|Not a directory")
        err = self.send_large(wid, "/out/secret", blob)
        self.assertIn("/out/secret", err)
        # an absolute dst names a path in the root
        dst = "/%s/inside.bin" % self.tmpname
        self.assertEqual(self.send_large(wid, dst, blob), "")
        self.assertEqual(read(os.path.join(root, self.tmpname, "inside.bin")), blob)


class Raw(Base):
    def refused(self, tar, want):
        name = "paths/bad-" + uuid.uuid4().hex[:8]
        code, msg = self.build_raw(name, tar)
        self.assertEqual(code, "1071", msg)
        for w in want:
            self.assertIn(w, msg)
        self.assert_not_stored(name)
        build = os.path.join(self.stack.data_dir, "build")
        self.assertFalse(os.path.exists(build) and os.listdir(build), "scratch left behind")
        return msg

    def test_hostile_archives_refused(self):
        out = self.outside
        cases = [
            ("dotdot", lambda t: add_file(t, "../" + self.tmpname, b"x"),
             ['entry "../%s" names ".."' % self.tmpname]),
            ("deep dotdot", lambda t: add_file(t, "a/../../" + self.tmpname, b"x"),
             ['"a/../../%s" names ".."' % self.tmpname]),
            ("absolute", lambda t: add_file(t, "/tmp/%s/f" % self.tmpname, b"x"),
             ['entry "/tmp/%s/f" is an absolute path' % self.tmpname]),
            ("write through a link", lambda t: (
                add_special(t, "l", tarfile.SYMTYPE, out),
                add_file(t, "l/" + self.tmpname, b"x")),
             ["entry l/%s: a symbolic link or a file is in the way" % self.tmpname]),
            ("overwrite through a link", lambda t: (
                add_special(t, "s", tarfile.SYMTYPE, self.sentinel),
                add_special(t, "s/x", tarfile.REGTYPE)),
             ["entry s/x: a symbolic link or a file is in the way"]),
            ("hard link out", lambda t: add_special(t, "h", tarfile.LNKTYPE, "../../etc/passwd"),
             ['hard link target "../../etc/passwd" names ".."']),
            ("character device", lambda t: (add_file(t, "ok", b"ok"),
                                            add_special(t, "dev/null0", tarfile.CHRTYPE)),
             ['entry "dev/null0" is a character device']),
            ("fifo", lambda t: add_special(t, "p", tarfile.FIFOTYPE), ['entry "p" is a fifo']),
        ]
        for what, build, want in cases:
            with self.subTest(what):
                self.refused(archive(build), want)

    def test_hostile_compressed_archives_refused(self):
        # gzip: read by the same reader (libarchive), refused with the same words
        self.refused(archive(lambda t: add_special(t, "dev/null0", tarfile.CHRTYPE), True),
                     ['entry "dev/null0" is a character device'])
        self.refused(archive(lambda t: add_special(t, "p", tarfile.FIFOTYPE), True),
                     ['entry "p" is a fifo'])
        self.refused(archive(lambda t: add_file(t, "../" + self.tmpname, b"x"), True),
                     ['entry "../%s" names ".."' % self.tmpname])
        self.refused(archive(lambda t: (add_special(t, "l", tarfile.SYMTYPE, self.outside),
                                        add_file(t, "l/" + self.tmpname, b"x")), True),
                     ["entry l/%s: a symbolic link or a file is in the way" % self.tmpname])
        # what no format reads is no image the process engine could unpack
        self.refused(b"not an archive at all\n" * 40, ["not an archive the agent reads"])

    def test_links_alone_are_kept(self):
        # a link to anywhere is a link in the image (it resolves in the workload): accepted,
        # and stored as it was sent
        tar = archive(lambda t: (add_special(t, "l", tarfile.SYMTYPE, self.outside),
                                 add_file(t, "run.sh", b"sleep 1\n")))
        got = list(self.core.BuildImage(core_pb2.BuildImageOptions(
            name="paths/links", tags=["v1"], build_method=core_pb2.BuildImageOptions.RAW,
            tar=tar), timeout=60))
        self.assertEqual([(m.progress, m.status) for m in got], [("paths/links:v1", "finished")])
        with open(os.path.join(self.stack.data_dir, "registry", "paths", "links", "v1.tar"),
                  "rb") as f:
            self.assertEqual(f.read(), tar)


class Exec(Base):
    def test_a_forged_pid_file_is_not_signalled(self):
        # An interactive exec keeps its pid in a file of the workload's root, for the agent to
        # end its process group when the client goes. The workload can write that file: here
        # it names a process group of the test's. The agent must not signal it.
        bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)
        try:
            wid, root = self.workload()
            script = ("for f in .pivirt-pid-*; do echo %d > \"$f\"; done; echo forged; "
                      "sleep 60" % bystander.pid)
            done = []

            def requests():
                yield core_pb2.ExecuteWorkloadOptions(
                    workload_id=wid, commands=["/bin/sh", "-c", script], open_stdin=True)
                while not done:  # the input stays open: the client goes away instead
                    time.sleep(0.1)

            call = self.core.ExecuteWorkload(requests(), timeout=60)
            out = b""
            for m in call:
                out += m.data
                if b"forged" in out:
                    break
            self.assertIn(b"forged", out)
            call.cancel()  # the client goes: the agent ends the exec
            done.append(True)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:  # the cancel reaches the agent, which acts
                if bystander.poll() is not None:
                    break
                time.sleep(0.2)
            self.assertIsNone(bystander.poll(), "the agent signalled a process group named by "
                                                "the workload")
        finally:
            bystander.kill()
            bystander.wait()


class Scm(Base):
    def repo(self):
        repo = tempfile.mkdtemp(prefix="pv-scm-", dir=self.stack.tmpdir)
        env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e",
                   GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@e")
        for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "1"]):
            subprocess.run(["git", "-C", repo] + args, check=True, capture_output=True, env=env)
        return "file://" + repo

    def scm(self, name, build):
        builds = core_pb2.Builds(stages=["one"])
        builds.builds["one"].CopyFrom(build)
        return core_pb2.BuildImageOptions(name=name, tags=["v1"], builds=builds,
                                          build_method=core_pb2.BuildImageOptions.SCM)

    def build(self, name, build):
        t = pvtest.grpc_trailers(self.addr, "/pb.CoreRPC/BuildImage",
                                 self.scm(name, build).SerializeToString(), timeout=120)
        return t.get("grpc-status"), t.get("grpc-message", "")

    def test_dir_with_dotdot_refused(self):
        repo = self.repo()
        for d in ("..", "a/../../" + self.tmpname, "../" + self.tmpname):
            code, msg = self.build("paths/scmdir", core_pb2.Build(repo=repo, dir=d))
            self.assertEqual(code, "1071", d)
            self.assertIn('builds.builds[one].dir: "%s" leaves the stage\'s root' % d, msg)
        self.assert_not_stored("paths/scmdir")

    def test_compressed_base_with_device_refused(self):
        base = os.path.join(self.stack.data_dir, "images", "pathsbase", "dev.tar")
        os.makedirs(os.path.dirname(base), exist_ok=True)
        with open(base, "wb") as f:
            f.write(archive(lambda t: (add_file(t, "ok", b"ok"),
                                       add_special(t, "dev/" + self.tmpname, tarfile.CHRTYPE)),
                            True))
        code, msg = self.build("paths/scmdev", core_pb2.Build(
            repo=self.repo(), base_image="pathsbase:dev", commands=["true"]))
        self.assertEqual(code, "1071", msg)
        self.assertIn("stage one: base image pathsbase:dev: ", msg)
        self.assertIn('entry "dev/%s" is a character device' % self.tmpname, msg)
        self.assert_not_stored("paths/scmdev")
        # the same base without the device builds: the check refuses only what it must
        with open(base, "wb") as f:
            f.write(archive(lambda t: add_file(t, "ok", b"ok"), True))
        got = list(self.core.BuildImage(self.scm("paths/scmok", core_pb2.Build(
            repo=self.repo(), base_image="pathsbase:dev", commands=["test -f ok"])),
            timeout=120))
        self.assertEqual([m.progress for m in got if m.status == "finished"], ["paths/scmok:v1"])

    def test_build_commands_run_as_a_uid_of_their_own(self):
        # worker.default_user "dynamic" (the default) and a root agent: the commands run as a
        # uid of the dynamic range, own their stage's root, and cannot write the agent's files
        # nor a root-owned directory outside
        got = list(self.core.BuildImage(self.scm("paths/scmuid", core_pb2.Build(
            repo=self.repo(), commands=["id -u > uid.txt", "id -G > groups.txt"])),
            timeout=120))
        self.assertEqual([m.progress for m in got if m.status == "finished"],
                         ["paths/scmuid:v1"], got)
        image = os.path.join(self.stack.data_dir, "images", "paths", "scmuid", "v1.tar")
        with tarfile.open(image) as t:
            uid = int(t.extractfile("./uid.txt" if "./uid.txt" in t.getnames() else "uid.txt")
                      .read())
            groups = (t.extractfile("./groups.txt" if "./groups.txt" in t.getnames()
                                    else "groups.txt").read().split())
        self.assertTrue(1879048192 <= uid <= 1879113727, uid)
        self.assertEqual(groups, [str(uid).encode()])  # no supplementary group of the agent's
        planted = os.path.join(self.stack.data_dir, "images", self.tmpname)
        for target in (os.path.join(self.outside, "planted"), planted):
            code, msg = self.build("paths/scmesc", core_pb2.Build(
                repo=self.repo(), commands=["echo x > %s" % target]))
            self.assertNotEqual(code, "0", target)
            self.assertIn("Permission denied", msg)
            self.assertFalse(os.path.exists(target), target)
        self.assert_not_stored("paths/scmesc")


if __name__ == "__main__":
    unittest.main(verbosity=2)
