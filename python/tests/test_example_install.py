# Covers README.md's "From Python" block and doc/python.md's install and example commands.
"""The Python example against the real atmosphere simulation, and `make
install` putting the package where Debian's python3 finds it."""
import os
import re
import subprocess
import sys

from conftest import ROOT, readline, rest


def test_region_viewer_example_against_the_simulation(procs, tmp_path):
    sim = procs.lua_script(os.path.join(ROOT, "examples", "atmosphere", "simulation.lua"),
                           "--steps", "30", "--wait", "1", "--rate", "50", "--quiet")
    ns = readline(sim, r"^nameserver (\S+)$").group(1)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    v = procs.start([sys.executable, os.path.join(ROOT, "examples", "python", "region_viewer.py"),
                     "--nameserver", ns, "--every", "10", "--out", str(tmp_path)], env=env)
    out = rest(v, timeout=60)
    steps = [line for line in out if line.startswith("step ")]
    assert len(steps) == 3, out
    # the default box (0..90 N, 0..180 E) of a 3x36x72 grid, 2x2 blocks: 3x9x19 at most
    assert all(re.match(r"step \d+ t [\d.]+ h region 3x9x\d+ min [\d.]+ mean [\d.]+ max [\d.]+ saved ", s)
               for s in steps), steps
    assert re.match(r"final step 30, \d+ events, \d+ bytes received", out[-1]), out
    assert len(os.listdir(tmp_path)) == 3
    assert v.wait(10) == 0


def test_make_install_puts_the_package_where_python3_finds_it(tmp_path):
    prefix = tmp_path / "prefix"
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    r = subprocess.run(["make", "-s", "-C", ROOT, "install", "PREFIX=%s" % prefix],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    pydir = prefix / ("lib/python3.%d/dist-packages" % sys.version_info[1])
    assert (pydir / "lecho" / "_paths.py").exists()
    code = ("import lecho; print(lecho.LIBRARY)\n"
            "with lecho.Context(quiet=True) as c:\n"
            "    ch = c.channel('x'); got = []\n"
            "    ch.consumer(lambda ev, m: got.append(ev))\n"
            "    ch.producer().submit_sync({'a': 1}); print(got)\n")
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("LUA_", "LECHO_")) and k != "PYTHONPATH"}
    clean["PYTHONPATH"] = str(pydir)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean,
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == [str(prefix / "lib" / "liblecho.so.0"), "[{'a': 1}]"]


def test_a_luarocks_style_install_writes_no_python_package_outside_its_tree(tmp_path):
    # LuaRocks gives the Lua tree's directories and no PREFIX: the package
    # must not land in PREFIX's (/usr/local's) dist-packages.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    tree = "/rock"
    r = subprocess.run(["make", "-s", "-C", ROOT, "install", "DESTDIR=%s" % tmp_path,
                        "INST_LIBDIR=%s/lib" % tree, "INST_LUADIR=%s/lua" % tree, "INST_BINDIR=%s/bin" % tree,
                        "INST_INCDIR=%s/include" % tree, "INST_CLIBDIR=%s/clib" % tree],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    written = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs]
    assert any(p.endswith("/rock/clib/liblecho.so.0") for p in written), written
    assert not [p for p in written if p.endswith(".py")], written


def test_the_default_prefix_installs_into_a_directory_on_debians_sys_path(tmp_path):
    # `make install` without PREFIX (/usr/local): the package lands in a
    # directory Debian's python3 searches, no PYTHONPATH needed (staged
    # under DESTDIR here, the machine's /usr/local left alone)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    r = subprocess.run(["make", "-s", "-C", ROOT, "install-python", "DESTDIR=%s" % tmp_path],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    inits = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs if f == "__init__.py"]
    assert len(inits) == 1, inits
    pydir = os.path.dirname(os.path.dirname(inits[0]))[len(str(tmp_path)):]
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run(["/usr/bin/python3", "-c", "import sys; print('\\n'.join(sys.path))"],
                       capture_output=True, text=True, env=clean)
    assert pydir in r.stdout.split("\n"), (pydir, r.stdout)


def test_keygen_finds_the_installed_script_without_prefix_bin_on_path(tmp_path):
    # review N2: under a custom PREFIX, lecho.keygen needed PREFIX/bin on PATH
    prefix = tmp_path / "prefix"
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    r = subprocess.run(["make", "-s", "-C", ROOT, "install", "PREFIX=%s" % prefix],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    pydir = prefix / ("lib/python3.%d/dist-packages" % sys.version_info[1])
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("LUA_", "LECHO_")) and k != "PYTHONPATH"}
    clean["PYTHONPATH"] = str(pydir)
    clean["PATH"] = "/usr/bin:/bin"
    keys = tmp_path / "keys"
    r = subprocess.run([sys.executable, "-c", "import lecho, sys; print(lecho.keygen('viewer', dir=sys.argv[1]))",
                        str(keys)], capture_output=True, text=True, env=clean, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert (keys / "viewer.key").exists() and (keys / "viewer.pub").exists()
