#!/usr/bin/python3
"""The README's "First ten minutes", run exactly as printed.

Every ```sh block of the section is taken from README.md and its commands run one after the
other in one bash, as a newcomer would type them, each with its own exit status, output and
errors kept; then each step's status and key output is checked: the stack comes up, the image
is built, two instances are deployed and listed, logs show the script's line, exec prints the
script, the drain of the one node fails as the README says it does (its printed answer, with
"..." for what varies), the two are removed, and down leaves nothing running. A command that
stops working, a step that goes missing or an answer that changes fails the test.

The commands run from a tree that stands for the checkout: ops/ is the repository's, build/
the test build (so `export PATH="$PWD/build/bin:$PATH"` finds its pvcli), and what they create
(hello/) stays in it. The stack gets a data directory, ports and key prefix of its own through
PIVIRT_DATA_DIR, PIVIRT_REDIS_PORT, PIVIRT_GATEWAY_LISTEN, PIVIRT_METRICS_PORT,
PIVIRT_KEY_PREFIX (pvcli follows through PIVIRT_ENDPOINT), and PIVIRT_BIN_DIR makes `up` start
the test build's programs without building.
"""
import os
import re
import subprocess
import unittest

import pvtest

SECTION = "## First ten minutes"
# The steps the section must hold, in this order (a regular expression each, matched against the
# start of a command).
STEPS = [
    ("up", r"\./ops/pivirt up$"),
    ("path", r"export PATH="),
    ("mkdir", r"mkdir hello$"),
    ("script", r"echo .* > hello/run\.sh$"),
    ("build", r"pvcli image build hello:1 hello$"),
    ("deploy", r"pvcli workload deploy hello .*--count 2"),
    ("list", r"pvcli workload list hello$"),
    ("pick", r"ID=\$\(pvcli -q workload list hello"),
    ("logs", r"pvcli workload logs \$ID$"),
    ("exec", r"pvcli workload exec \$ID cat run\.sh$"),
    ("drain", r"pvcli node drain local \$\(hostname -s\)$"),
    ("uncordon", r"pvcli node uncordon local \$\(hostname -s\)$"),
    ("remove", r"pvcli workload remove \$\(pvcli -q workload list hello\)$"),
    ("down", r"\./ops/pivirt down$"),
    ("clean", r"rm -r hello$"),
]


def section(text):
    """The lines of README's section SECTION (up to the next "## " heading)."""
    lines = text.splitlines()
    start = lines.index(SECTION)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
               len(lines))
    return lines[start + 1:end]


def blocks(lines):
    """[(info string, [lines])] of the fenced blocks among LINES."""
    out, cur = [], None
    for ln in lines:
        if cur is None and ln.startswith("```"):
            cur = (ln[3:].strip(), [])
        elif cur is not None and ln.startswith("```"):
            out.append(cur)
            cur = None
        elif cur is not None:
            cur[1].append(ln)
    return out


def commands(lines):
    """The commands of the sh blocks: blank and comment lines skipped, a line ending in a
    backslash joined with the next."""
    cmds, pending = [], ""
    for info, body in blocks(lines):
        if info != "sh":
            continue
        for ln in body:
            if pending:
                ln, pending = pending + ln, ""
            if ln.endswith("\\"):
                pending = ln[:-1]
                continue
            if ln.strip() and not ln.lstrip().startswith("#"):
                cmds.append(ln.strip())
    return cmds


def answer_after(lines, command):
    """The plain (not sh) block that follows the sh block holding COMMAND: the answer the
    README prints for it."""
    seen = False
    for info, body in blocks(lines):
        if seen and info == "":
            return body
        seen = seen or (info == "sh" and command in [ln.strip() for ln in body])
    return None


def pattern(printed):
    """A regular expression for a printed line where "..." stands for anything."""
    return ".*".join(re.escape(part) for part in printed.split("...")) + "$"


def rows(text):
    return [ln.split() for ln in text.splitlines() if ln.strip()]


class Readme(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        err = pvtest.ensure_libvirtd()
        if err:
            raise unittest.SkipTest(err)
        with open(os.path.join(pvtest.SOURCE_DIR, "README.md")) as f:
            cls.lines = section(f.read())
        cls.stack = pvtest.OpsStack("readme")
        tree = os.path.join(cls.stack.tmp, "checkout")
        os.makedirs(os.path.join(tree, ".tools", "node_modules", ".bin"))
        os.symlink(os.path.join(pvtest.SOURCE_DIR, "ops"), os.path.join(tree, "ops"))
        os.symlink(pvtest.BUILD_DIR, os.path.join(tree, "build"))
        os.symlink(pvtest.BUF, os.path.join(tree, ".tools", "node_modules", ".bin", "buf"))
        cls.stack.root = tree

    @classmethod
    def tearDownClass(cls):
        cls.stack.close()

    def run_all(self, cmds):
        """Runs CMDS in one bash from the tree; [(rc, stdout, stderr)] per command."""
        out = os.path.join(self.stack.tmp, "out")
        os.mkdir(out)
        script = ['cd "$1" || exit 99']
        for i, cmd in enumerate(cmds):
            # the command exactly as printed, its streams and status kept apart
            script += ["{ " + cmd, '} >"$2/%d.out" 2>"$2/%d.err" </dev/null' % (i, i),
                       'echo $? >"$2/%d.rc"' % i]
        subprocess.run(["bash", "-c", "\n".join(script), "bash", self.stack.root, out],
                       env=self.stack.env, timeout=480, check=True)
        results = []
        for i in range(len(cmds)):
            with open(os.path.join(out, "%d.rc" % i)) as f:
                rc = int(f.read())
            with open(os.path.join(out, "%d.out" % i), errors="replace") as f:
                stdout = f.read()
            with open(os.path.join(out, "%d.err" % i), errors="replace") as f:
                stderr = f.read()
            results.append((rc, stdout, stderr))
        return results

    def test_first_ten_minutes_run_as_printed(self):
        cmds = commands(self.lines)
        self.assertEqual(len(cmds), len(STEPS), "the section's commands:\n" + "\n".join(cmds))
        for cmd, (step, rx) in zip(cmds, STEPS):
            self.assertRegex(cmd, "^" + rx, step)
        results = self.run_all(cmds)
        got = {step: r for (step, _), r in zip(STEPS, results)}

        def ok(step):
            rc, out, err = got[step]
            if rc != 0:
                self.stack.failed = True
            self.assertEqual(rc, 0, "%s exited %d\nstdout: %s\nstderr: %s" %
                             (step, rc, out, err[-3000:]))
            return out, err

        out, err = ok("up")
        self.assertIn("pivirt is up", out)
        self.assertNotIn("building", err)  # PIVIRT_BIN_DIR: nothing built
        for step in ("path", "mkdir", "script", "pick", "uncordon", "clean"):
            ok(step)
        out, _ = ok("build")
        self.assertEqual(rows(out)[0], ["ID", "STATUS", "PROGRESS", "ERROR"])
        self.assertEqual(rows(out)[1][1:3], ["finished", "hello:1"], out)
        out, _ = ok("deploy")
        self.assertEqual(rows(out)[0], ["ID", "NAME", "NODENAME", "SUCCESS", "ERROR"])
        deployed = rows(out)[1:]
        self.assertEqual([r[3] for r in deployed], ["true", "true"], out)
        out, _ = ok("list")
        listed = rows(out)[1:]
        self.assertEqual(sorted(r[0] for r in listed), sorted(r[0] for r in deployed), out)
        self.assertEqual({(r[3], r[4]) for r in listed}, {("local", "hello:1")}, out)
        out, _ = ok("logs")
        self.assertEqual(out, "hello from hello\n")
        out, _ = ok("exec")
        self.assertEqual(out, "echo hello from $APP_NAME; sleep 3600\n")
        # the drain of the one node fails, and says what the README prints
        rc, out, err = got["drain"]
        self.assertEqual(rc, 1, (out, err))
        printed = answer_after(self.lines, cmds[[s for s, _ in STEPS].index("drain")])
        self.assertTrue(printed, "the README prints no answer after the drain")
        for line in printed:
            self.assertTrue(any(re.match(pattern(line), e) for e in err.splitlines()),
                            "the README's answer %r is not what the drain said:\n%s" % (line, err))
        out, _ = ok("remove")
        self.assertEqual(sorted(r[0] for r in rows(out)[1:]), sorted(r[0] for r in deployed))
        self.assertEqual([r[1] for r in rows(out)[1:]], ["true", "true"], out)
        out, err = ok("down")
        self.assertIn("nothing of the stack", err)
        self.assertEqual(self.stack.pids(), {})
        self.assertEqual(self.stack.processes(), [])
        r = self.stack.pivirt("status", timeout=60)
        self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
        self.assertEqual({ln.split()[-1] for ln in r.stdout.splitlines()}, {"down"}, r.stdout)
        self.assertFalse(os.path.exists(os.path.join(self.stack.root, "hello")))
        self.assertEqual(self.stack.logs_with_sanitizer_reports(), [])


if __name__ == "__main__":
    pvtest.main()
