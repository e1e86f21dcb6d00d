#!/usr/bin/python3
"""Self-test of check_layout.py on small synthetic inputs: it must find a
planted circle (with the symbols of each edge) and a planted long file, and
accept what the rule allows (the op registry and the op files registering
each other, files of different graphs, tests/, *.cu, build trees).  The last
case compiles two files with the C compiler and lays the objects out as CMake
does, so the nm and object-to-source path is tested too (skipped without a
compiler)."""

import io
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_layout as cl  # noqa: E402


def syms(defined=(), undefined=()):
    return (set(defined), set(undefined))


class Circles(unittest.TestCase):
    def test_planted_circle_found_with_symbols(self):
        files = {
            "server/a.c": syms(["srv_a"], ["srv_b", "srv_c"]),
            "server/b.c": syms(["srv_b"], ["srv_a2"]),
            "server/b2.c": syms(["srv_a2"], ["srv_a"]),
            "server/c.c": syms(["srv_c"], []),  # called, calls nothing back
        }
        found = cl.circles(files)
        self.assertEqual(len(found), 1)
        g, comp, inside, cycles = found[0]
        self.assertEqual(g, "server")
        self.assertEqual(comp, ["server/a.c", "server/b.c", "server/b2.c"])
        self.assertEqual(inside["server/a.c"], {"server/b.c": ["srv_b"]})
        self.assertEqual(inside["server/b2.c"], {"server/a.c": ["srv_a"]})
        self.assertEqual(cycles, [("server/a.c", "server/b.c", "server/b2.c")])
        out = io.StringIO()
        cl.report([], found, 800, out)
        text = out.getvalue()
        self.assertIn("server/a.c -> server/b.c: srv_b", text)
        self.assertIn("server/a.c -> server/b.c -> server/b2.c -> server/a.c", text)
        self.assertIn("What to do", text)

    def test_two_cycles_in_one_component(self):
        files = {
            "device/x.c": syms(["dev_x"], ["dev_y", "dev_z"]),
            "device/y.c": syms(["dev_y"], ["dev_x"]),
            "device/z.c": syms(["dev_z"], ["dev_x"]),
        }
        (g, comp, _, cycles), = cl.circles(files)
        self.assertEqual(comp, ["device/x.c", "device/y.c", "device/z.c"])
        self.assertEqual(cycles, [("device/x.c", "device/y.c"), ("device/x.c", "device/z.c")])

    def test_registry_and_op_files_allowed(self):
        files = {
            "device/registry.c": syms(["dev_op_register", "dev_registry_init"],
                                      ["dev_register_array_ops", "dev_register_reduce_ops"]),
            "device/ops/array.c": syms(["dev_register_array_ops"], ["dev_op_register"]),
            "device/ops/reduce.c": syms(["dev_register_reduce_ops"], ["dev_op_register"]),
            "device/engine.c": syms(["dev_execute"], ["dev_registry_init"]),
        }
        self.assertEqual(cl.circles(files), [])

    def test_exemption_is_narrow(self):
        # Two op files calling each other, and the registry in a circle with
        # another file, are still circles.
        files = {
            "device/registry.c": syms(["dev_op_register"], ["dev_register_a_ops", "dev_eng"]),
            "device/ops/a.c": syms(["dev_register_a_ops", "dev_a"], ["dev_op_register", "dev_b"]),
            "device/ops/b.c": syms(["dev_b"], ["dev_a"]),
            "device/engine.c": syms(["dev_eng"], ["dev_op_register"]),
        }
        comps = [c for _, c, _, _ in cl.circles(files)]
        self.assertIn(["device/ops/a.c", "device/ops/b.c"], comps)
        self.assertIn(["device/engine.c", "device/registry.c"], comps)

    def test_graphs_are_separate(self):
        files = {
            "client/a.c": syms(["shared_x"], ["shared_y"]),
            "server/b.c": syms(["shared_y"], ["shared_x"]),
            "tests/t.c": syms(["shared_z"], ["shared_x"]),
        }
        self.assertEqual(cl.circles(files), [])

    def test_tarjan_components(self):
        edges = {"a": {"b": []}, "b": {"c": []}, "c": {"a": [], "d": []},
                 "d": {"e": []}, "e": {"d": []}, "f": {"a": []}}
        self.assertEqual(cl.tarjan("abcdef", edges), [["a", "b", "c"], ["d", "e"], ["f"]])


class LongFiles(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="check-layout-")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def write(self, rel, lines):
        path = os.path.join(self.dir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("".join("int x%d;\n" % i for i in range(lines)))

    def test_planted_long_file(self):
        self.write("server/big.c", 801)
        self.write("server/ok.c", 800)
        self.write("include/paradev/big.h", 900)
        self.write("tests/unit/test_huge.c", 3000)     # tests are exempt
        self.write("device/cuda/kernels.cu", 3000)     # CUDA kernels too
        self.write("build/server/gen.c", 3000)         # a build tree
        open(os.path.join(self.dir, "build", "CMakeCache.txt"), "w").close()
        self.write(".git/x.c", 3000)
        self.assertEqual(cl.long_files(self.dir, 800),
                         [("include/paradev/big.h", 900), ("server/big.c", 801)])
        out = io.StringIO()
        cl.report(cl.long_files(self.dir, 800), [], 800, out)
        self.assertIn("server/big.c: 801 lines (1 over)", out.getvalue())
        self.assertIn("Split it by domain", out.getvalue())

    def test_last_line_without_newline_counts(self):
        path = os.path.join(self.dir, "a.c")
        with open(path, "w") as f:
            f.write("a\nb")
        self.assertEqual(cl.count_lines(path), 2)


@unittest.skipUnless(shutil.which("cc") and shutil.which("nm"), "needs cc and nm")
class EndToEnd(unittest.TestCase):
    """Real objects laid out as CMake's Makefile generator does."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="check-layout-e2e-")
        self.src = os.path.join(self.dir, "src")
        self.build = os.path.join(self.dir, "build")
        os.makedirs(os.path.join(self.src, "client"))
        self.tdirs = [os.path.join(self.build, "client", "CMakeFiles", t)
                      for t in ("lib.dir", "other.dir")]
        for d in self.tdirs:
            os.makedirs(d)
        open(os.path.join(self.build, "CMakeCache.txt"), "w").close()

    def tearDown(self):
        shutil.rmtree(self.dir)

    def compile(self, name, text, in_depinfo, listed=True):
        """Compiles client/name into lib.dir (listed in its DependInfo.cmake
        when `listed`) or, without in_depinfo, into other.dir, which has no
        DependInfo.cmake (found through the .o.d file)."""
        src = os.path.join(self.src, "client", name)
        with open(src, "w") as f:
            f.write(text)
        tdir = self.tdirs[0 if in_depinfo else 1]
        obj = os.path.join(tdir, name + ".o")
        subprocess.check_call(["cc", "-c", "-MD", "-MF", obj + ".d", src, "-o", obj])
        if in_depinfo and listed:
            with open(os.path.join(tdir, "DependInfo.cmake"), "a") as f:
                # As CMake writes it: object paths from the top of the build.
                f.write('set(CMAKE_DEPENDS_DEPENDENCY_FILES\n  "%s" "client/CMakeFiles/lib.dir/%s.o"'
                        ' "gcc" "client/CMakeFiles/lib.dir/%s.o.d"\n  )\n' % (src, name, name))

    def run_check(self):
        out = io.StringIO()
        old, sys.stdout = sys.stdout, out
        try:
            rc = cl.main(["--source-dir", self.src, "--build-dir", self.build])
        finally:
            sys.stdout = old
        return rc, out.getvalue()

    def test_circle_from_objects(self):
        # a.c is placed through DependInfo.cmake, b.c through its .o.d file.
        self.compile("a.c", "int pdc_b(void);\nint pdc_a(void) { return pdc_b(); }\n", True)
        self.compile("b.c", "int pdc_a(void);\nint pdc_b(void) { return 0; }\n"
                     "int pdc_b2(void) { return pdc_a(); }\n", False)
        rc, text = self.run_check()
        self.assertEqual(rc, 1, text)
        self.assertIn("client/a.c -> client/b.c: pdc_b", text)
        self.assertIn("client/b.c -> client/a.c: pdc_a", text)

    def test_stale_object_ignored(self):
        # c.o is in lib.dir but its DependInfo.cmake no longer lists it (the
        # source left the target): its calls do not count.
        self.compile("a.c", "int pdc_b(void);\nint pdc_a(void) { return pdc_b(); }\n", True)
        self.compile("b.c", "int pdc_c(void);\nint pdc_b(void) { return pdc_c(); }\n", False)
        self.compile("c.c", "int pdc_a(void);\n"
                     "int pdc_c(void) { return pdc_a(); }\n", True, listed=False)
        rc, text = self.run_check()
        self.assertEqual(rc, 0, text)

    def test_one_way_passes(self):
        self.compile("a.c", "int pdc_b(void);\nint pdc_a(void) { return pdc_b(); }\n", True)
        self.compile("b.c", "int pdc_b(void) { return 0; }\n", False)
        rc, text = self.run_check()
        self.assertEqual(rc, 0, text)
        self.assertIn("layout OK", text)


if __name__ == "__main__":
    unittest.main(verbosity=2)
